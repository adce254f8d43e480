package repotest

import (
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/nodetrust/nodetrust"

// Groups of packages that rules name, by import-path prefix.
var (
	storage   = []string{"database/sql", "modernc.org/sqlite", "github.com/jackc/pgx"}
	httpServe = []string{"net/http"}
	rpc       = []string{"google.golang.org/grpc", "google.golang.org/protobuf", module + "/api"}
	logging   = []string{"log", "log/slog"}
	// tpmDevice is what opens a TPM: device and TCP transports, the simulator.
	tpmDevice = []string{"github.com/google/go-tpm/tpm2/transport/linuxtpm", "github.com/google/go-tpm/tpm2/transport/tcp", "github.com/google/go-tpm-tools", module + "/tpm/tpmsim"}
	binaries  = []string{module + "/internal", module + "/cmd"}
	// thirdParty is any package outside the standard library and this
	// module, except those of vettedThirdParty.
	thirdParty = []string{thirdPartyMarker}
)

// vettedThirdParty are the packages outside the standard library that even
// the libraries kept free of third-party code may import, each with why.
// Their own closure is still walked, so one that starts importing more is
// caught.
var vettedThirdParty = []struct{ pkg, why string }{
	{"github.com/spiffe/go-spiffe/v2/spiffeid",
		"DESIGN.md §6 chooses go-spiffe for SPIFFE IDs; its spiffeid package imports only the standard library, and pki builds and parses every SPIFFE ID with it"},
}

// libraryRules is the one table of what each library at the root of the
// module may never pull in, directly or through anything it imports (the
// closure `go list -deps` reports). Every library must have a row, so a new
// one is placed deliberately. The reasons are the layout's (DESIGN.md §6a):
// libraries are for other programs, so they never reach a binary's
// packages, and the small ones stay small enough to vendor.
var libraryRules = []struct {
	pkg        string
	neverReach [][]string
	why        string
}{
	{"pki", [][]string{thirdParty, rpc, httpServe, logging, binaries},
		"CAs, pins and sealed tokens: every other library builds on it, so it stays free of wire types and I/O frameworks"},
	{"pki/tlspin", [][]string{thirdParty, rpc, httpServe, logging, binaries},
		"pinned TLS for any client of fleetd"},
	{"pki/joinresponse", [][]string{storage, binaries},
		"the signed join result needs the wire types (api/joinv1), and nothing heavier"},
	{"pki/netreport", [][]string{thirdParty, rpc, httpServe, logging, binaries},
		"the signed network report, built by bcd and verified by fleetd: the standard library and pki only"},
	{"pki/confirm", [][]string{thirdParty, rpc, httpServe, logging, binaries},
		"the install confirmation, signed by bcd and verified by fleetd: the standard library and pki only"},
	{"pki/pkitest", [][]string{thirdParty, httpServe, logging, binaries},
		"test support: throwaway keys and CAs"},
	{"callsig", [][]string{thirdParty, storage, httpServe, logging, binaries, {module + "/tpm", module + "/attest"}},
		"signed calls for clients in any program: the standard library and pki only"},
	{"attest", [][]string{storage, httpServe, rpc, logging, binaries, tpmDevice, {module + "/pki"}},
		"the verifier works from bytes: it never opens a TPM (tpm/tpmpub is its one nodetrust dependency)"},
	{"tpm", [][]string{storage, httpServe, rpc, logging, binaries, {module + "/attest", module + "/pki"}},
		"a thin layer over go-tpm: it makes no policy decisions"},
	{"tpm/tpmpub", [][]string{storage, httpServe, rpc, logging, binaries, tpmDevice},
		"public-area parsing shared by the verifier and the TPM client"},
	{"tpm/tpmsim", [][]string{storage, httpServe, rpc, logging, binaries},
		"the simulator transport for tests and fleetd dev"},
	{"tpm/tpmtest", [][]string{storage, httpServe, rpc, binaries},
		"test support: swtpm and simulator set-up"},
	{"localapi", [][]string{storage, binaries, {"net/http/httptest"}},
		"the client of a node daemon, for programs on the machine"},
}

// ownerRules say which packages of one binary may be imported by whom.
// Patterns are as the go command's: "x/..." is x and everything under it,
// "x" alone is x only.
var ownerRules = []struct {
	pkgs       string   // the packages this rule covers
	importable []string // the packages that may import them
	why        string
}{
	{module + "/internal/bcd/...", []string{module + "/internal/bcd/...", module + "/cmd/bcd", module + "/internal/integration"},
		"bcd's packages are bcd's alone"},
	{module + "/internal/fleetd/...", []string{module + "/internal/fleetd/...", module + "/cmd/fleetd", module + "/internal/load", module + "/internal/integration"},
		"fleetd's packages are fleetd's (and its load tool's) alone"},
	{module + "/internal/bcd", []string{module + "/internal/bcd/command"},
		"bcd's wiring function is called by its command layer only"},
	{module + "/internal/fleetd", []string{module + "/internal/fleetd/command"},
		"fleetd's wiring function is called by its command layer only"},
	{module + "/internal/bcd/localserver", []string{module + "/internal/bcd"},
		"the local-API server is started by bcd's wiring function only"},
	{module + "/internal/bcd/federation", []string{module + "/internal/bcd/localserver"},
		"machine proofs are the local-API server's"},
	{module + "/internal/bcd/leases", []string{module + "/internal/bcd/localserver"},
		"leases are kept by the local-API server's leases service"},
	{module + "/internal/fleetd/pkcs11key", []string{module + "/internal/fleetd", module + "/internal/fleetd/command"},
		"the PKCS#11 binding (cgo, crypto11) is opened by fleetd's wiring and commands only, so nothing else links it"},
	{module + "/internal/fleetd/render/talos", []string{module + "/internal/fleetd/render/renderers", module + "/internal/fleetd/command"},
		"the Talos machinery library is heavy: only the registry builder and fleetd's commands import its one user"},
	{module + "/internal/fleetd/render/renderers", []string{module + "/internal/fleetd", module + "/internal/fleetd/command", module + "/internal/integration"},
		"the renderers of fleetd.toml are built by fleetd's wiring (and its commands) only"},
}

// pkcs11Binding is what loads a PKCS#11 module: crypto11 and the cgo
// package under it.
var pkcs11Binding = []string{"github.com/ThalesGroup/crypto11", "github.com/miekg/pkcs11", module + "/internal/fleetd/pkcs11key"}

// talosMachinery is the Talos machinery library, which only
// internal/fleetd/render/talos imports.
var talosMachinery = []string{"github.com/siderolabs/talos"}

// programRules say what a program may never pull in. bcd runs on every
// machine of the fleet: it links no PKCS#11 binding (and so needs no cgo
// for it) and none of fleetd's packages.
var programRules = []struct {
	pkg        string
	neverReach [][]string
	why        string
}{
	{"cmd/bcd", [][]string{pkcs11Binding, {module + "/internal/fleetd"}},
		"bcd holds no CA key: it never links the PKCS#11 binding or fleetd's packages"},
	{"internal/fleetd/render", [][]string{talosMachinery},
		"the render interface and its template renderer stay free of the Talos machinery library, so what uses them does not link it"},
	{"internal/fleetd/inventory", [][]string{talosMachinery},
		"the inventory checks install disks with package render, never with the Talos library"},
}

// matchPattern reports whether p matches a go-command-style pattern.
func matchPattern(p, pattern string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return hasPrefix(p, base)
	}
	return p == pattern
}

// pkgInfo is what go list says of one package.
type pkgInfo struct {
	imports []string
}

func listPackages(t *testing.T) map[string]pkgInfo {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("the go command is needed to read the import graph")
	}
	cmd := exec.Command(gobin, "list", "-deps", "-tags", "tpmsim", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := make(map[string]pkgInfo)
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkgs[f[0]] = pkgInfo{imports: f[1:]}
	}
	return pkgs
}

const thirdPartyMarker = "(any third-party package)"

func hasPrefix(p, prefix string) bool {
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}

// matches reports whether package p falls under a rule's prefix.
func matches(p, prefix string) bool {
	if prefix == thirdPartyMarker {
		for _, v := range vettedThirdParty {
			if p == v.pkg {
				return false
			}
		}
		first, _, _ := strings.Cut(p, "/")
		return strings.Contains(first, ".") && !hasPrefix(p, module)
	}
	return hasPrefix(p, prefix)
}

// pathTo returns the import path from pkg to a package matching one of
// prefixes, or nil when pkg reaches none.
func pathTo(pkgs map[string]pkgInfo, pkg string, prefixes []string) []string {
	via := map[string]string{pkg: ""}
	queue := []string{pkg}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, q := range pkgs[p].imports {
			if _, seen := via[q]; seen {
				continue
			}
			via[q] = p
			for _, f := range prefixes {
				if matches(q, f) {
					path := []string{q}
					for r := p; r != ""; r = via[r] {
						path = append([]string{r}, path...)
					}
					return path
				}
			}
			queue = append(queue, q)
		}
	}
	return nil
}

func short(p string) string { return strings.TrimPrefix(p, module+"/") }

func shortPath(path []string) string {
	out := make([]string, len(path))
	for i, p := range path {
		out[i] = short(p)
	}
	return strings.Join(out, " → ")
}

// TestLibraryDependencies walks the real dependency closure of each
// library and fails, with the import path that gets there, when it reaches
// something its row forbids.
func TestLibraryDependencies(t *testing.T) {
	pkgs := listPackages(t)
	covered := map[string]bool{}
	for _, r := range libraryRules {
		covered[module+"/"+r.pkg] = true
		pkg := module + "/" + r.pkg
		if _, ok := pkgs[pkg]; !ok {
			t.Errorf("library %s is in the table but not in the module", r.pkg)
			continue
		}
		var forbidden []string
		for _, g := range r.neverReach {
			forbidden = append(forbidden, g...)
		}
		// Each forbidden prefix on its own, so that every breach is named.
		for _, f := range forbidden {
			if path := pathTo(pkgs, pkg, []string{f}); path != nil {
				t.Errorf("library %s reaches %s: %s (%s)", r.pkg, short(f), shortPath(path), r.why)
			}
		}
		// A library never logs: it returns errors.
		for _, imp := range pkgs[pkg].imports {
			if slices.Contains(logging, imp) {
				t.Errorf("library %s imports %s: libraries return errors and do not log", r.pkg, imp)
			}
		}
	}
	// Every library at the root of the module has a row.
	var missing []string
	for p := range pkgs {
		if !strings.HasPrefix(p, module+"/") || covered[p] {
			continue
		}
		rel := short(p)
		if strings.HasPrefix(rel, "internal/") || strings.HasPrefix(rel, "cmd/") || strings.HasPrefix(rel, "api/") {
			continue
		}
		missing = append(missing, rel)
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("package %s sits at the root of the module but has no row in libraryRules: a root package is a library for other programs; give it a row, or move it under internal/<binary>/", m)
	}
	// The walk must have seen the graph it claims to check.
	if path := pathTo(pkgs, module+"/localapi", []string{"google.golang.org/grpc"}); path == nil {
		t.Error("localapi does not reach google.golang.org/grpc: is the import graph read right?")
	}
}

// TestOwnership checks who imports the packages of each binary: bcd's and
// fleetd's packages are their own, and the daemon's parts are the daemon's.
func TestOwnership(t *testing.T) {
	pkgs := listPackages(t)
	checked := 0
	for importer, info := range pkgs {
		if !strings.HasPrefix(importer, module+"/") {
			continue
		}
		for _, imp := range info.imports {
			for _, r := range ownerRules {
				if !matchPattern(imp, r.pkgs) {
					continue
				}
				checked++
				ok := false
				for _, allowed := range r.importable {
					if matchPattern(importer, allowed) {
						ok = true
					}
				}
				if !ok {
					t.Errorf("%s imports %s: %s", short(importer), short(imp), r.why)
				}
			}
		}
	}
	if checked == 0 {
		t.Error("no import of a binary's package was seen: is the import graph read right?")
	}
}

// TestProgramDependencies checks programRules with the same walk as the
// libraries' table.
func TestProgramDependencies(t *testing.T) {
	pkgs := listPackages(t)
	for _, r := range programRules {
		pkg := module + "/" + r.pkg
		if _, ok := pkgs[pkg]; !ok {
			t.Errorf("program %s is in the table but not in the module", r.pkg)
			continue
		}
		for _, g := range r.neverReach {
			for _, f := range g {
				if path := pathTo(pkgs, pkg, []string{f}); path != nil {
					t.Errorf("%s reaches %s: %s (%s)", r.pkg, short(f), shortPath(path), r.why)
				}
			}
		}
	}
	// The walk must see the binding where it belongs.
	if path := pathTo(pkgs, module+"/cmd/fleetd", []string{module + "/internal/fleetd/pkcs11key"}); path == nil {
		t.Error("cmd/fleetd does not reach internal/fleetd/pkcs11key: is the import graph read right?")
	}
	if path := pathTo(pkgs, module+"/internal/fleetd/render/talos", talosMachinery); path == nil {
		t.Error("internal/fleetd/render/talos does not reach the Talos machinery library: is the import graph read right?")
	}
}
