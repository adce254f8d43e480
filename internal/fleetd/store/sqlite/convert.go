package sqlite

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// The range of times a Unix nanosecond int64 can hold.
var (
	minTime = time.Unix(0, math.MinInt64)
	maxTime = time.Unix(0, math.MaxInt64)
)

// args converts Go values to column values, keeping the first conversion
// error so that a statement's arguments can be built in one expression and
// checked once.
type args struct{ err error }

// time returns t as Unix nanoseconds, or NULL for the zero time.
func (a *args) time(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	if t.Before(minTime) || t.After(maxTime) {
		a.fail(fmt.Errorf("time %s is outside the storable range (years 1678 to 2262)", t.Format(time.RFC3339)))
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixNano(), Valid: true}
}

// gen returns an identity generation as a signed integer, the only kind
// SQLite stores.
func (a *args) gen(g uint64) int64 {
	if g > math.MaxInt64 {
		a.fail(fmt.Errorf("generation %d is too large", g))
		return 0
	}
	return int64(g)
}

// list returns l as a JSON array; an empty or nil list is "[]".
func (a *args) list(l []string) string {
	if len(l) == 0 {
		return "[]"
	}
	b, err := json.Marshal(l)
	if err != nil {
		a.fail(err)
		return "[]"
	}
	return string(b)
}

func (a *args) fail(err error) {
	if a.err == nil {
		a.err = err
	}
}

// fromNanos is the inverse of args.time: NULL is the zero time, anything
// else a time in UTC.
func fromNanos(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return time.Unix(0, n.Int64).UTC()
}

// fromList is the inverse of args.list: an empty array is a nil slice.
func fromList(s string) ([]string, error) {
	var l []string
	if err := json.Unmarshal([]byte(s), &l); err != nil {
		return nil, fmt.Errorf("decode list %q: %w", s, err)
	}
	if len(l) == 0 {
		return nil, nil
	}
	return l, nil
}
