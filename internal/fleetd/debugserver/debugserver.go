// Package debugserver is fleetd's optional debug endpoint (debug_listen in
// fleetd.toml): the process's memory figures read from runtime/metrics, as
// JSON at /debug/memory, and Go's profiler under /debug/pprof/. It is off
// by default and only ever listens on a loopback address, since it has no
// authentication; nodetrust-load reads /debug/memory for the heap beside
// the RSS.
package debugserver

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"runtime"
	"runtime/metrics"
)

// Memory is what /debug/memory answers.
type Memory struct {
	// HeapLiveBytes is the heap the last GC found live
	// (/gc/heap/live:bytes).
	HeapLiveBytes uint64 `json:"heap_live_bytes"`
	// HeapObjectsBytes is the memory held by heap objects, live or not
	// yet swept (/memory/classes/heap/objects:bytes).
	HeapObjectsBytes uint64 `json:"heap_objects_bytes"`
	// StacksBytes is the memory of goroutine stacks
	// (/memory/classes/heap/stacks:bytes).
	StacksBytes uint64 `json:"stacks_bytes"`
	// TotalBytes is all memory the Go runtime mapped
	// (/memory/classes/total:bytes).
	TotalBytes uint64 `json:"total_bytes"`
	// Goroutines is the number of live goroutines
	// (/sched/goroutines:goroutines).
	Goroutines uint64 `json:"goroutines"`
	// GCCycles is the number of completed GC cycles (/gc/cycles/total:gc-cycles).
	GCCycles uint64 `json:"gc_cycles"`
}

var names = []string{
	"/gc/heap/live:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/stacks:bytes",
	"/memory/classes/total:bytes",
	"/sched/goroutines:goroutines",
	"/gc/cycles/total:gc-cycles",
}

// ReadMemory reads the process's memory figures.
func ReadMemory() Memory {
	s := make([]metrics.Sample, len(names))
	for i, n := range names {
		s[i].Name = n
	}
	metrics.Read(s)
	v := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	return Memory{HeapLiveBytes: v(0), HeapObjectsBytes: v(1), StacksBytes: v(2), TotalBytes: v(3), Goroutines: v(4), GCCycles: v(5)}
}

// Handler serves /debug/memory (with ?gc=1, after a garbage collection,
// so that the heap is the live one) and /debug/pprof/.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/memory", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("gc") == "1" {
			runtime.GC()
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(ReadMemory())
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
