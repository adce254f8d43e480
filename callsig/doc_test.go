package callsig

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// docPath is the wire format document, relative to this package.
const docPath = "../docs/callsig.md"

// docBlocks reads the fenced blocks of the document whose info string is
// "callsig-input <name>" (lines "key: value") or "callsig-hex <name>" (hex
// digits; '#' starts a comment; whitespace is ignored).
func docBlocks(t *testing.T) (inputs map[string]map[string]string, hexes map[string][]byte, text string) {
	t.Helper()
	raw, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatalf("read the wire format document: %v", err)
	}
	inputs, hexes = map[string]map[string]string{}, map[string][]byte{}
	var kind, name string
	var body []string
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if kind == "" {
			if rest, ok := strings.CutPrefix(line, "```callsig-"); ok {
				f := strings.Fields(rest)
				if len(f) != 2 {
					t.Fatalf("%s:%d: block %q wants a kind and a name", docPath, n, line)
				}
				kind, name, body = f[0], f[1], nil
			}
			continue
		}
		if strings.TrimSpace(line) != "```" {
			body = append(body, line)
			continue
		}
		switch kind {
		case "input":
			m := map[string]string{}
			for _, l := range body {
				k, v, ok := strings.Cut(l, ":")
				if !ok {
					t.Fatalf("%s: input %s: line %q is not name: value", docPath, name, l)
				}
				m[strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
			inputs[name] = m
		case "hex":
			var digits strings.Builder
			for _, l := range body {
				l, _, _ = strings.Cut(l, "#")
				digits.WriteString(strings.Join(strings.Fields(l), ""))
			}
			b, err := hex.DecodeString(digits.String())
			if err != nil {
				t.Fatalf("%s: hex %s: %v", docPath, name, err)
			}
			hexes[name] = b
		default:
			t.Fatalf("%s: unknown block kind callsig-%s", docPath, kind)
		}
		kind = ""
	}
	if kind != "" {
		t.Fatalf("%s: block %s is not closed", docPath, name)
	}
	return inputs, hexes, string(raw)
}

func TestDocWorkedExample(t *testing.T) {
	inputs, hexes, text := docBlocks(t)
	in := func(block, key string) string {
		t.Helper()
		v, ok := inputs[block][key]
		if !ok {
			t.Fatalf("the document has no %s in input block %q", key, block)
		}
		return v
	}
	hexIn := func(block, key string) []byte {
		t.Helper()
		b, err := hex.DecodeString(in(block, key))
		if err != nil {
			t.Fatalf("input %s.%s: %v", block, key, err)
		}
		return b
	}
	want := func(name string, got []byte) {
		t.Helper()
		w, ok := hexes[name]
		if !ok {
			t.Errorf("the document has no callsig-hex block %q", name)
			return
		}
		if !bytes.Equal(got, w) {
			t.Errorf("%s: the document says\n%x\nthe code makes\n%x", name, w, got)
		}
	}

	// The envelope.
	key := ed25519.NewKeyFromSeed(hexIn("envelope", "seed"))
	want("public-key", key.Public().(ed25519.PublicKey))
	ts, err := strconv.ParseInt(in("envelope", "timestamp"), 10, 64)
	if err != nil {
		t.Fatalf("timestamp: %v", err)
	}
	nonce := hexIn("envelope", "nonce")
	if len(nonce) != NonceSize {
		t.Fatalf("nonce is %d bytes", len(nonce))
	}
	at := func() time.Time { return time.Unix(0, ts) }
	s, err := NewSigner(SignerConfig{Sender: in("envelope", "sender"), Key: key, Now: at, Rand: bytes.NewReader(nonce)})
	if err != nil {
		t.Fatal(err)
	}
	env, err := s.Sign(in("envelope", "namespace"), in("envelope", "key_expr"), in("envelope", "kind"), []byte(in("envelope", "payload")))
	if err != nil {
		t.Fatal(err)
	}
	signed := env.appendSigned(nil)
	want("signed-bytes", signed)
	want("signature", env.Signature)
	want("envelope", mustMarshal(t, env))
	if !ed25519.Verify(key.Public().(ed25519.PublicKey), hexes["signed-bytes"], hexes["signature"]) {
		t.Error("the document's signature does not verify over its signed bytes")
	}
	// A daemon decodes the document's envelope and accepts it.
	var got Envelope
	if err := got.UnmarshalBinary(hexes["envelope"]); err != nil {
		t.Fatalf("decode the document's envelope: %v", err)
	}
	v, err := NewVerifier(VerifierConfig{Namespace: in("envelope", "namespace"), Keys: KeyMap{env.Sender: s.Public()}, Now: at})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(&got); err != nil {
		t.Errorf("verify the document's envelope: %v", err)
	}

	// The boot statement and the endorsement.
	boot := ed25519.NewKeyFromSeed(hexIn("machine", "boot_seed"))
	want("boot-public-key", boot.Public().(ed25519.PublicKey))
	st := BootStatement{Namespace: in("machine", "namespace"), NodeID: in("machine", "node_id"), BootID: in("machine", "boot_id"),
		BootPublicKey: boot.Public().(ed25519.PublicKey)}
	stBytes := st.appendBody(append([]byte(BootStatementLabel), 0))
	want("statement-bytes", stBytes)
	d := st.digest()
	want("statement-digest", d[:])
	if sha := sha256.Sum256(stBytes); sha != d {
		t.Error("the statement digest is not the SHA-256 of its signed bytes")
	}
	en := Endorsement{Namespace: st.Namespace, NodeID: st.NodeID, BootID: st.BootID, Sender: in("machine", "sender"),
		SenderKey: key.Public().(ed25519.PublicKey)}
	want("endorsement-bytes", en.signed())
	enSig, err := en.Sign(boot)
	if err != nil {
		t.Fatal(err)
	}
	want("endorsement-signature", enSig)

	// The limits and check names the document states are the code's.
	for _, s := range []string{
		"`" + CheckNoSignature + "`", "`" + CheckMalformed + "`", "`" + CheckUnknownSender + "`",
		"`" + CheckSignature + "`", "`" + CheckNamespace + "`", "`" + CheckTimestamp + "`",
		"`" + CheckReplay + "`", "`" + CheckReplayCacheFull + "`", "`" + CheckMachineProof + "`",
		`"` + EnvelopeLabel + `"`, `"` + BootStatementLabel + `"`, `"` + EndorsementLabel + `"`,
		groupDigits(MaxPayloadLen), groupDigits(MaxEnvelopeLen), groupDigits(DefaultMaxReplayEntries),
		groupDigits(MaxCertLen), "1–" + strconv.Itoa(MaxNamespaceLen) + " bytes", "1–" + strconv.Itoa(MaxKeyExprLen) + " bytes",
		"1–" + strconv.Itoa(MaxKindLen) + " bytes", strconv.Itoa(MaxChainCerts),
	} {
		if !strings.Contains(text, s) {
			t.Errorf("the document does not mention %s", s)
		}
	}
}

// groupDigits writes n with commas between groups of three digits.
func groupDigits(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
