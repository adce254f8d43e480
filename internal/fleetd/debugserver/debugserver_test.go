package debugserver

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestMemoryAndProfiler(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/debug/memory")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m Memory
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	if m.HeapObjectsBytes == 0 || m.TotalBytes < m.HeapObjectsBytes || m.StacksBytes == 0 || m.Goroutines == 0 {
		t.Errorf("memory figures %+v: want a heap, stacks and goroutines, within the total", m)
	}
	for path, want := range map[string]int{"/debug/pprof/": 200, "/debug/pprof/cmdline": 404, "/other": 404} {
		r, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, r.StatusCode, want)
		}
	}
}
