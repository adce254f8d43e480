package callsig_test

import (
	"bufio"
	"os"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/localapi"
)

// TestDocKeyExpressionParses checks that the worked example of
// docs/callsig.md signs a key expression of the grammar docs/local-api.md
// gives, as the daemon parses it, for the example's namespace and sender:
// a client written from the document sends what a daemon accepts.
func TestDocKeyExpressionParses(t *testing.T) {
	f, err := os.Open("../docs/callsig.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in := map[string]string{}
	inBlock := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "```callsig-input envelope":
			inBlock = true
		case inBlock && strings.TrimSpace(line) == "```":
			inBlock = false
		case inBlock:
			k, v, _ := strings.Cut(line, ":")
			in[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	if in["key_expr"] == "" {
		t.Fatal("docs/callsig.md has no key_expr in its envelope input block")
	}
	k, err := localapi.ParseKeyExpr(in["key_expr"])
	if err != nil {
		t.Fatalf("the worked example's key expression does not parse: %v", err)
	}
	if k.Namespace != in["namespace"] || k.Sender != in["sender"] {
		t.Errorf("the key expression names namespace %q and sender %q, the envelope %q and %q", k.Namespace, k.Sender, in["namespace"], in["sender"])
	}
	if k.Receiver != k.SenderNode {
		t.Errorf("the example is a local call, yet the receiver %q is not the sender node %q", k.Receiver, k.SenderNode)
	}
}
