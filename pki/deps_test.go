package pki

import (
	"os/exec"
	"strings"
	"testing"
)

// TestForbiddenImports keeps pki free of storage and HTTP: neither pki nor
// anything it imports may import database/sql, net/http or the store
// package. One path is exempt: package joinv1 holds the generated gRPC
// stubs next to the messages pki uses, and google.golang.org/grpc imports
// net/http. The walk therefore does not enter google.golang.org/grpc; it
// still fails if pki, or any other dependency, reaches a forbidden package.
func TestForbiddenImports(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found")
	}
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports := make(map[string][]string)
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		imports[f[0]] = f[1:]
	}
	const self = "github.com/nodetrust/nodetrust/pki"
	forbidden := []string{"database/sql", "net/http", "github.com/nodetrust/nodetrust/internal/fleetd/store"}
	isForbidden := func(p string) bool {
		for _, f := range forbidden {
			if p == f || strings.HasPrefix(p, f+"/") {
				return true
			}
		}
		return false
	}
	// Walk the import graph from pki, remembering how each package was
	// reached so that a failure shows the path.
	via := map[string]string{self: ""}
	queue := []string{self}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, q := range imports[p] {
			if _, seen := via[q]; seen || q == "google.golang.org/grpc" {
				continue
			}
			via[q] = p
			if isForbidden(q) {
				path := q
				for r := p; r != ""; r = via[r] {
					path = r + " -> " + path
				}
				t.Errorf("pki reaches a forbidden package: %s", path)
				continue
			}
			queue = append(queue, q)
		}
	}
	if _, ok := via["google.golang.org/protobuf/proto"]; !ok {
		t.Error("walk did not reach google.golang.org/protobuf/proto; is the import graph read right?")
	}
}
