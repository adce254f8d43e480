package load

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nodetrust/nodetrust/api/sessionframe"
)

// Report is everything a run measured and checked; it is also the JSON
// the tool writes.
type Report struct {
	Started     time.Time     `json:"started"`
	Run         RunInfo       `json:"run"`
	Machine     Machine       `json:"machine"`
	Phases      []PhaseResult `json:"phases"`
	Floor       *Floor        `json:"floor,omitempty"`
	Comparisons []Comparison  `json:"floor_vs_measured,omitempty"`
	Goals       []Goal        `json:"goals"`
	Checks      []Check       `json:"checks"`
	// OK is true when every check passed.
	OK bool `json:"ok"`
}

// RunInfo is the run's configuration and the server it measured.
type RunInfo struct {
	Nodes       int    `json:"nodes"`
	Concurrency int    `json:"concurrency"`
	Renewals    int    `json:"renewals_per_node"`
	Revoke      int    `json:"revoked"`
	KEM         string `json:"kem"`
	// KeyExchanges are the started server's tls_key_exchanges; empty is
	// Go's default (X25519MLKEM768 first).
	KeyExchanges []string `json:"tls_key_exchanges,omitempty"`
	// TokenKeys names the started server's keys that live in a PKCS#11
	// token ("node-ca pkcs11:token=…"); empty when every key is a file.
	TokenKeys []string `json:"token_keys,omitempty"`
	// Server is "started" (fleetd started by the tool) or "targeted".
	Server  string `json:"server"`
	Address string `json:"address"`
	PID     int    `json:"pid,omitempty"`
	// PIDs are the processes of several replicas, whose CPU time and
	// memory the server columns sum (PID is then empty).
	PIDs []int `json:"pids,omitempty"`
	// NoFile is RLIMIT_NOFILE after raising it, inherited by a started
	// server.
	NoFile uint64 `json:"rlimit_nofile"`
	// SessionTransport is the sessions' transport asked for (framed or
	// grpc); SessionsFramed and SessionsGRPC count the sessions opened
	// over each, SessionsFellBack those over gRPC because the server
	// refused the framed session.
	SessionTransport string `json:"session_transport"`
	SessionsFramed   int64  `json:"sessions_framed"`
	SessionsGRPC     int64  `json:"sessions_grpc"`
	SessionsFellBack int64  `json:"sessions_fell_back_to_grpc,omitempty"`
	// ServerRSSIdleBytes is the server's RSS before the first phase.
	ServerRSSIdleBytes int64 `json:"server_rss_idle_bytes,omitempty"`
	// ToolPeakRSSBytes is the load tool's own peak RSS.
	ToolPeakRSSBytes int64 `json:"tool_peak_rss_bytes,omitempty"`
}

// PhaseResult is one phase's row.
type PhaseResult struct {
	Name    string `json:"name"`
	Planned int    `json:"planned"`
	// Ops is the operations that succeeded; Errors counts failed
	// attempts, retried or not.
	Ops          int     `json:"ops"`
	Errors       int     `json:"errors"`
	Seconds      float64 `json:"seconds"`
	OpsPerSecond float64 `json:"ops_per_second"`
	P50Ms        float64 `json:"p50_ms"`
	P90Ms        float64 `json:"p90_ms"`
	P99Ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	// Server is nil when the server's process is not known.
	Server         *ServerUsage `json:"server,omitempty"`
	ToolCPUSeconds float64      `json:"tool_cpu_seconds"`
	ErrorSamples   []string     `json:"error_samples,omitempty"`
}

// ServerUsage is the server process's CPU and memory over a phase, from
// /proc/<pid>/stat and /proc/<pid>/status.
type ServerUsage struct {
	CPUSeconds float64 `json:"cpu_seconds"`
	CPUPerOpMs float64 `json:"cpu_per_op_ms"`
	// OpsPerCoreSecond is Ops / CPUSeconds: the rate one fully busy core
	// of the server would sustain at this cost.
	OpsPerCoreSecond float64 `json:"ops_per_core_second"`
	PeakRSSBytes     int64   `json:"peak_rss_bytes"`
	// PeakSincePhase is true when VmHWM was reset at the phase's start;
	// false means the peak since the server started.
	PeakSincePhase bool  `json:"peak_since_phase_start"`
	RSSBeforeBytes int64 `json:"rss_before_bytes"`
	RSSAfterBytes  int64 `json:"rss_after_bytes"`
	// For the session phase: the RSS with every session held (after
	// --settle), and per session (RSSHeld - RSSBefore) / sessions, and
	// against the server's idle RSS before the first phase.
	RSSHeldBytes                 int64   `json:"rss_held_bytes,omitempty"`
	RSSPerSessionBytes           float64 `json:"rss_per_session_bytes,omitempty"`
	RSSPerSessionSinceIdleBytes  float64 `json:"rss_per_session_since_idle_bytes,omitempty"`
	PeakRSSWithSessionsHeldBytes int64   `json:"peak_rss_sessions_held_bytes,omitempty"`
	// From the server's debug endpoint (runtime/metrics), when it has
	// one, each read after a garbage collection: heap objects plus
	// goroutine stacks before and after the phase, and for the session
	// phase with every session held and per session.
	HeapBeforeBytes     int64   `json:"heap_before_bytes,omitempty"`
	HeapAfterBytes      int64   `json:"heap_after_bytes,omitempty"`
	HeapHeldBytes       int64   `json:"heap_held_bytes,omitempty"`
	HeapPerSessionBytes float64 `json:"heap_per_session_bytes,omitempty"`
	// GoroutinesHeld is the server's goroutines with every session held.
	GoroutinesHeld int64 `json:"goroutines_held,omitempty"`
}

func (s *ServerUsage) perOp(ops int) {
	if ops > 0 {
		s.CPUPerOpMs = s.CPUSeconds * 1000 / float64(ops)
	}
	if s.CPUSeconds > 0 {
		s.OpsPerCoreSecond = float64(ops) / s.CPUSeconds
	}
}

// Comparison sets a phase's measured server CPU per operation beside the
// floor's server share.
type Comparison struct {
	Op                string  `json:"op"`
	FloorServerMicros float64 `json:"floor_server_us"`
	FloorPerCore      float64 `json:"floor_ops_per_core_second"`
	// MeasuredServerMicros is the server's CPU time per operation in the
	// run; MeasuredPerCore its inverse.
	MeasuredServerMicros float64 `json:"measured_server_us"`
	MeasuredPerCore      float64 `json:"measured_ops_per_core_second"`
	// Ratio is MeasuredServerMicros / FloorServerMicros.
	Ratio float64 `json:"ratio"`
	// MachineFloor is the floor of the whole machine with the load tool
	// on it: CPUs × 1e6 / (server + client floor).
	MachineFloor float64 `json:"machine_floor_ops_per_second"`
	Measured     float64 `json:"measured_ops_per_second"`
}

// Goal is one of DESIGN.md's performance goals and how the run did.
type Goal struct {
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	// Status is "met", "missed" or "not measured".
	Status string `json:"status"`
	Note   string `json:"note,omitempty"`
}

// Check is one correctness check; a failed check fails the run.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

func (r *Report) phase(name string) *PhaseResult {
	for i := range r.Phases {
		if r.Phases[i].Name == name {
			return &r.Phases[i]
		}
	}
	return nil
}

// compare fills Comparisons from the phases and the floor.
func (r *Report) compare() {
	if r.Floor == nil {
		return
	}
	for _, x := range []struct {
		phase string
		floor FloorOp
	}{{phaseJoin, r.Floor.Join}, {phaseRenew, r.Floor.Renew}, {phaseSession, r.Floor.Session}} {
		p := r.phase(x.phase)
		if p == nil {
			continue
		}
		c := Comparison{Op: x.phase, FloorServerMicros: x.floor.ServerMicros, FloorPerCore: x.floor.ServerPerCore,
			MachineFloor: x.floor.Machine, Measured: p.OpsPerSecond}
		if p.Server != nil && p.Ops > 0 {
			c.MeasuredServerMicros = p.Server.CPUPerOpMs * 1000
			c.MeasuredPerCore = p.Server.OpsPerCoreSecond
			if x.floor.ServerMicros > 0 {
				c.Ratio = c.MeasuredServerMicros / x.floor.ServerMicros
			}
		}
		r.Comparisons = append(r.Comparisons, c)
	}
}

// Scale at which DESIGN.md states the goals.
const (
	goalJoins          = 20000
	goalJoinRate       = 600
	goalRenewRate      = 2000
	goalSessions       = 10000
	goalSessionBytes   = 30 << 10
	goalRevocationP99  = time.Second
	goalCPUFloorFactor = 2
	// Issue 20's tighter goals: join and renewal at most 1.25× their
	// floor, a renewal under 350 µs of server CPU (on the reference
	// machine).
	goalCPUFloorTight = 1.25
	goalRenewMicros   = 350
)

// judge fills Goals. It never fails the run.
func (r *Report) judge() {
	status := func(ok bool) string {
		if ok {
			return "met"
		}
		return "missed"
	}
	scale := func(have, want int, what string) string {
		if have < want {
			return fmt.Sprintf("measured over %d %s; the goal is stated for %d", have, what, want)
		}
		return ""
	}
	cmp := func(op string) *Comparison {
		for i := range r.Comparisons {
			if r.Comparisons[i].Op == op {
				return &r.Comparisons[i]
			}
		}
		return nil
	}
	rate := func(name, what string, want float64, atScale int) {
		p := r.phase(name)
		g := Goal{Goal: fmt.Sprintf("%s ≥ %.0f/s sustained", what, want), Status: "not measured"}
		if p != nil && p.Ops > 0 {
			g.Measured = fmt.Sprintf("%.0f/s over %d", p.OpsPerSecond, p.Ops)
			g.Status = status(p.OpsPerSecond >= want)
			g.Note = scale(p.Ops, atScale, what)
		}
		r.Goals = append(r.Goals, g)
		g = Goal{Goal: fmt.Sprintf("server CPU per %s ≤ %d× the floor's server share", strings.TrimSuffix(what, "s"), goalCPUFloorFactor), Status: "not measured"}
		if c := cmp(name); c != nil && c.Ratio > 0 {
			g.Measured = fmt.Sprintf("%.0f µs vs floor %.0f µs (%.2f×)", c.MeasuredServerMicros, c.FloorServerMicros, c.Ratio)
			g.Status = status(c.Ratio <= goalCPUFloorFactor)
		}
		r.Goals = append(r.Goals, g)
		g = Goal{Goal: fmt.Sprintf("server CPU per %s ≤ %.2f× the floor's server share (issue 20)", strings.TrimSuffix(what, "s"), goalCPUFloorTight), Status: "not measured"}
		if c := cmp(name); c != nil && c.Ratio > 0 {
			g.Measured = fmt.Sprintf("%.2f×", c.Ratio)
			g.Status = status(c.Ratio <= goalCPUFloorTight)
		}
		r.Goals = append(r.Goals, g)
	}
	rate(phaseJoin, "token joins", goalJoinRate, goalJoins)
	rate(phaseRenew, "renewals", goalRenewRate, 0)
	g0 := Goal{Goal: fmt.Sprintf("server CPU per renewal < %d µs (issue 20, on the reference machine)", goalRenewMicros), Status: "not measured"}
	if c := cmp(phaseRenew); c != nil && c.MeasuredServerMicros > 0 {
		g0.Measured = fmt.Sprintf("%.0f µs", c.MeasuredServerMicros)
		g0.Status = status(c.MeasuredServerMicros < goalRenewMicros)
	}
	r.Goals = append(r.Goals, g0)

	g := Goal{Goal: fmt.Sprintf("%d live sessions at ≤ %d KiB of server memory each", goalSessions, goalSessionBytes>>10), Status: "not measured"}
	if p := r.phase(phaseSession); p != nil && p.Server != nil && p.Ops > 0 {
		g.Measured = fmt.Sprintf("%.1f KiB per session over %d held", p.Server.RSSPerSessionBytes/1024, p.Ops)
		if h := p.Server.HeapPerSessionBytes; h > 0 {
			g.Measured += fmt.Sprintf(" (Go heap and stacks: %.1f KiB, %d goroutines)", h/1024, p.Server.GoroutinesHeld)
		}
		g.Status = status(p.Server.RSSPerSessionBytes <= goalSessionBytes)
		g.Note = scale(p.Ops, goalSessions, "sessions")
	}
	r.Goals = append(r.Goals, g)

	g = Goal{Goal: fmt.Sprintf("a revocation reaches its live session in < %s at p99, with all sessions held", goalRevocationP99), Status: "not measured"}
	if p := r.phase(phaseRevoke); p != nil && p.Ops > 0 {
		g.Measured = fmt.Sprintf("p99 %.1f ms over %d revocations, %d sessions held", p.P99Ms, p.Ops, r.held())
		g.Status = status(p.P99Ms < ms(goalRevocationP99))
		g.Note = scale(r.held(), goalSessions, "sessions")
	}
	r.Goals = append(r.Goals, g)
}

func (r *Report) held() int {
	if p := r.phase(phaseSession); p != nil {
		return p.Ops
	}
	return 0
}

// sessionTransport says which transport the sessions used.
func (ri RunInfo) sessionTransport() string {
	switch {
	case ri.SessionsFramed > 0 && ri.SessionsGRPC > 0:
		return fmt.Sprintf("mixed: %d framed, %d gRPC (%d because the server refused the framed session)", ri.SessionsFramed, ri.SessionsGRPC, ri.SessionsFellBack)
	case ri.SessionsGRPC > 0 && ri.SessionsFellBack > 0:
		return "gRPC (the server refused the framed session asked for)"
	case ri.SessionsGRPC > 0:
		return "gRPC"
	case ri.SessionsFramed > 0:
		return "framed (ALPN " + sessionframe.ALPN + ")"
	}
	return ri.SessionTransport + " (none opened)"
}

// print writes the report's tables.
func (r *Report) print(w io.Writer) {
	ri := r.Run
	fmt.Fprintf(w, "nodetrust-load: %d nodes, concurrency %d, %d renewals each, %d revoked; fleetd %s at %s",
		ri.Nodes, ri.Concurrency, ri.Renewals, ri.Revoke, ri.Server, ri.Address)
	if ri.PID > 0 {
		fmt.Fprintf(w, " (pid %d)", ri.PID)
	}
	if len(ri.PIDs) > 0 {
		fmt.Fprintf(w, " (pids %s; server columns summed)", strings.Trim(strings.Join(strings.Fields(fmt.Sprint(ri.PIDs)), ", "), "[]"))
	}
	fmt.Fprintf(w, "\nsessions: %s", ri.sessionTransport())
	kex := "Go's default (X25519MLKEM768 first)"
	if len(ri.KeyExchanges) > 0 {
		kex = strings.Join(ri.KeyExchanges, ", ")
	}
	if ri.Server == "started" {
		fmt.Fprintf(w, "\nTLS key exchanges: %s; join KEM %s", kex, ri.KEM)
	}
	for _, k := range ri.TokenKeys {
		fmt.Fprintf(w, "\nkey in a PKCS#11 token: %s", k)
	}
	m := r.Machine
	fmt.Fprintf(w, "\nmachine: %s, %d CPUs, %.1f GiB, Linux %s, %s; RLIMIT_NOFILE %d\n\n",
		m.CPUModel, m.CPUs, float64(m.MemTotal)/(1<<30), m.Kernel, m.GoVersion, ri.NoFile)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	// The headline: the server's CPU per operation, beside the rate.
	fmt.Fprintln(tw, "phase\tops\tops/s\tsrv µs/op\tsrv ops/core-s\tp50 ms\tp90 ms\tp99 ms\terrors\tsrv CPU s\tpeak RSS MiB\tRSS/session KiB\theap/session KiB\ttool CPU s\t")
	for _, p := range r.Phases {
		head, srv := "-\t-", "-\t-\t-\t-"
		if s := p.Server; s != nil {
			perSess, heapSess := "-", "-"
			if p.Name == phaseSession && p.Ops > 0 {
				perSess = fmt.Sprintf("%.1f", s.RSSPerSessionBytes/1024)
				if s.HeapPerSessionBytes > 0 {
					heapSess = fmt.Sprintf("%.1f", s.HeapPerSessionBytes/1024)
				}
			}
			perCore := "-"
			if s.OpsPerCoreSecond > 0 {
				perCore = fmt.Sprintf("%.0f", s.OpsPerCoreSecond)
			}
			head = fmt.Sprintf("%.0f\t%s", s.CPUPerOpMs*1000, perCore)
			srv = fmt.Sprintf("%.2f\t%.1f\t%s\t%s", s.CPUSeconds, float64(s.PeakRSSBytes)/(1<<20), perSess, heapSess)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%.1f\t%.1f\t%.1f\t%d\t%s\t%.2f\t\n",
			p.Name, p.Ops, p.OpsPerSecond, head, p.P50Ms, p.P90Ms, p.P99Ms, p.Errors, srv, p.ToolCPUSeconds)
	}
	tw.Flush()
	if ri.ToolPeakRSSBytes > 0 {
		fmt.Fprintf(w, "load tool's own peak RSS: %s\n", mib(ri.ToolPeakRSSBytes))
	}
	for _, p := range r.Phases {
		for _, e := range p.ErrorSamples {
			fmt.Fprintf(w, "  %s error: %s\n", p.Name, e)
		}
	}

	if f := r.Floor; f != nil {
		fmt.Fprintf(w, "\ncrypto floor: CPU per operation on one core of this machine (median of %d batches)\n", floorBatches)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, it := range f.Items {
			fmt.Fprintf(tw, "  %s\t%s\t%8.1f µs\n", it.Name, it.Side, it.MicrosPerOp)
		}
		tw.Flush()
		fmt.Fprintln(w, "\nfloor vs measured (server's share; a server core doing only this work):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "op\tfloor µs/op\tfloor ops/s/core\tmeasured srv µs/op\tmeasured ops/s/core\tratio\tmachine floor ops/s\tmeasured ops/s\t")
		for _, c := range r.Comparisons {
			meas := "-\t-\t-"
			if c.Ratio > 0 {
				meas = fmt.Sprintf("%.0f\t%.0f\t%.2f×", c.MeasuredServerMicros, c.MeasuredPerCore, c.Ratio)
			}
			fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%s\t%.0f\t%.0f\t\n", c.Op, c.FloorServerMicros, c.FloorPerCore, meas, c.MachineFloor, c.Measured)
		}
		tw.Flush()
		fmt.Fprintf(w, "  machine floor: both ends' cryptography on all %d CPUs, the load tool sharing the machine\n", m.CPUs)
	}

	fmt.Fprintln(w, "\ngoals (DESIGN.md; reported, never fatal):")
	for _, g := range r.Goals {
		fmt.Fprintf(w, "  [%s] %s: %s", g.Status, g.Goal, orDash(g.Measured))
		if g.Note != "" {
			fmt.Fprintf(w, " (%s)", g.Note)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "\nchecks:")
	for _, c := range r.Checks {
		mark := "ok"
		if !c.OK {
			mark = "FAILED"
		}
		fmt.Fprintf(w, "  [%s] %s: %s\n", mark, c.Name, c.Detail)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeJSON writes the report to path.
func (r *Report) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode the report: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write the report: %w", err)
	}
	return nil
}
