package netbox

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"gopkg.in/yaml.v3"
)

// The NetBox OpenAPI schema go-netbox ships, read from the module cache
// (scripts/deps.sh downloads it; nothing of it is copied here).
const (
	goNetbox        = "github.com/netbox-community/go-netbox/v4"
	goNetboxVersion = "v4.3.0"
)

var (
	schemaOnce sync.Once
	schemaDoc  map[string]any
	schemaErr  error
)

// openAPI returns NetBox's OpenAPI document; outside CI a missing module
// skips the test.
func openAPI(t *testing.T) map[string]any {
	t.Helper()
	schemaOnce.Do(func() {
		cmd := exec.Command("go", "mod", "download", "-json", goNetbox+"@"+goNetboxVersion)
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off")
		out, err := cmd.Output()
		if err != nil {
			schemaErr = fmt.Errorf("%s@%s is not in the module cache (make deps downloads it): %v", goNetbox, goNetboxVersion, err)
			return
		}
		var m struct{ Dir string }
		if err := json.Unmarshal(out, &m); err != nil {
			schemaErr = err
			return
		}
		data, err := os.ReadFile(filepath.Join(m.Dir, "api", "openapi.yaml"))
		if err != nil {
			schemaErr = err
			return
		}
		schemaErr = yaml.Unmarshal(data, &schemaDoc)
	})
	if schemaErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("NetBox's OpenAPI schema: %v", schemaErr)
		}
		t.Skipf("NetBox's OpenAPI schema: %v", schemaErr)
	}
	return schemaDoc
}

func dig(m any, path ...string) any {
	for _, p := range path {
		mm, ok := m.(map[string]any)
		if !ok {
			return nil
		}
		m = mm[p]
	}
	return m
}

// conform checks a JSON value against an OpenAPI schema: $ref, allOf,
// type, nullable, required, properties, items and enum; it lists every
// mismatch by JSON path.
func conform(doc map[string]any, schema any, v any, path string, errs *[]string) {
	s, _ := schema.(map[string]any)
	if s == nil {
		return
	}
	if ref, ok := s["$ref"].(string); ok {
		parts := strings.Split(strings.TrimPrefix(ref, "#/"), "/")
		conform(doc, dig(doc, parts...), v, path, errs)
		return
	}
	if all, ok := s["allOf"].([]any); ok {
		for _, sub := range all {
			conform(doc, sub, v, path, errs)
		}
	}
	if v == nil {
		if n, _ := s["nullable"].(bool); !n && s["type"] != nil {
			*errs = append(*errs, path+": null, not nullable")
		}
		return
	}
	typ, _ := s["type"].(string)
	ok := true
	switch typ {
	case "object":
		_, ok = v.(map[string]any)
	case "array":
		_, ok = v.([]any)
	case "string":
		_, ok = v.(string)
	case "integer":
		f, isNum := v.(float64)
		ok = isNum && f == float64(int64(f))
	case "number":
		_, ok = v.(float64)
	case "boolean":
		_, ok = v.(bool)
	}
	if !ok {
		*errs = append(*errs, fmt.Sprintf("%s: %T is not %s", path, v, typ))
		return
	}
	if enum, ok := s["enum"].([]any); ok && !slices.Contains(enum, v) {
		*errs = append(*errs, fmt.Sprintf("%s: %v is not one of %v", path, v, enum))
	}
	if obj, ok := v.(map[string]any); ok {
		for _, r := range asStrings(s["required"]) {
			if _, ok := obj[r]; !ok {
				*errs = append(*errs, path+": required "+r+" is missing")
			}
		}
		props, _ := s["properties"].(map[string]any)
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if ps, ok := props[k]; ok {
				conform(doc, ps, obj[k], path+"."+k, errs)
			} else if props != nil && s["additionalProperties"] == nil {
				*errs = append(*errs, path+": "+k+" is not in the schema")
			}
		}
	}
	if arr, ok := v.([]any); ok {
		for i, it := range arr {
			conform(doc, s["items"], it, fmt.Sprintf("%s[%d]", path, i), errs)
		}
	}
}

func asStrings(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, x := range l {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// responseSchema is the schema of a GET's 200 answer.
func responseSchema(doc map[string]any, path string) any {
	return dig(doc, "paths", path, "get", "responses", "200", "content", "application/json", "schema")
}

// parameters are the query parameters a GET of path takes.
func parameters(doc map[string]any, path string) []string {
	ps, _ := dig(doc, "paths", path, "get", "parameters").([]any)
	var out []string
	for _, p := range ps {
		if n, ok := dig(p, "name").(string); ok {
			out = append(out, n)
		}
	}
	return out
}
