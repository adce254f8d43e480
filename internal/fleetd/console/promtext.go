package console

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// maxMetricsBytes bounds the metrics text read from the server.
const maxMetricsBytes = 4 << 20

// series is one sample of the Prometheus text format: a metric name,
// its labels and its value.
type series struct {
	name   string
	labels map[string]string
	value  float64
}

// parseMetrics reads the Prometheus text exposition format (version
// 0.0.4): comment lines are skipped; a line that does not parse is an
// error naming its number. At most maxMetricsBytes are read.
func parseMetrics(r io.Reader) ([]series, error) {
	sc := bufio.NewScanner(io.LimitReader(r, maxMetricsBytes))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	var out []series
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s, err := parseLine(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d: %w", n, err)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return out, nil
}

func parseLine(line string) (series, error) {
	s := series{labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return s, fmt.Errorf("no value")
	}
	s.name, line = line[:i], line[i:]
	if line[0] == '{' {
		rest, err := parseLabels(line[1:], s.labels)
		if err != nil {
			return s, err
		}
		line = rest
	}
	fields := strings.Fields(line)
	if len(fields) < 1 || len(fields) > 2 {
		return s, fmt.Errorf("want a value and at most a timestamp after %s", s.name)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, fmt.Errorf("value of %s: %w", s.name, err)
	}
	s.value = v
	return s, nil
}

// parseLabels reads name="value" pairs up to the closing brace and
// returns what follows it.
func parseLabels(s string, into map[string]string) (string, error) {
	for {
		s = strings.TrimLeft(s, " ,")
		if strings.HasPrefix(s, "}") {
			return s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || len(s) < eq+2 || s[eq+1] != '"' {
			return "", fmt.Errorf("malformed label")
		}
		name := strings.TrimSpace(s[:eq])
		s = s[eq+2:]
		var b strings.Builder
		closed := false
		for i := 0; i < len(s); i++ {
			ch := s[i]
			if ch == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(s[i])
				}
				continue
			}
			if ch == '"' {
				s = s[i+1:]
				closed = true
				break
			}
			b.WriteByte(ch)
		}
		if !closed {
			return "", fmt.Errorf("unterminated label value of %s", name)
		}
		into[name] = b.String()
	}
}
