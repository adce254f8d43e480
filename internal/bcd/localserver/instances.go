package localserver

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodetrust/nodetrust/localapi"
)

// The files of one start of an instance, in run/instances/<name>.<start>/.
const (
	instanceKeyFile = "key"
	runtimeFile     = "runtime.json"
)

// errNameTaken means an instance of that name runs on this machine.
var errNameTaken = errors.New("instance name taken")

// instance is one start of an instance.
type instance struct {
	name        string
	key         ed25519.PublicKey
	dir         string
	keyFile     string
	runtimeFile string
	started     time.Time
	pid         atomic.Int64
	ended       sync.Once
}

// registry holds the running instances by name.
type registry struct {
	dir string // run/instances
	mu  sync.Mutex
	m   map[string]*instance
}

// newRegistry prepares dir, removing what a daemon that stopped without
// cleaning up left there: those instances' processes do not run under
// this daemon, and their keys are not known to it.
func newRegistry(dir string) (*registry, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("remove the instance files of an earlier boot in %s: %w", dir, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("make %s: %w", dir, err)
	}
	return &registry{dir: dir, m: map[string]*instance{}}, nil
}

// instanceName returns the name of a start: the requested one, or one
// made from the command's base name and a random suffix.
func instanceName(req localapi.StartRequest) (string, error) {
	if req.Name != "" {
		if err := localapi.ValidInstanceName(req.Name); err != nil {
			return "", fmt.Errorf("%w; choose another --name", err)
		}
		return req.Name, nil
	}
	var b strings.Builder
	for _, r := range strings.ToLower(filepath.Base(req.Command)) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case r == '.' || r == '_' || r == '-':
			if b.Len() > 0 {
				b.WriteRune(r)
			}
		}
		if b.Len() >= 40 {
			break
		}
	}
	base := strings.TrimPrefix(b.String(), "nodetrust-")
	if base == "" {
		base = "instance"
	}
	return base + "-" + randomHex(3), nil
}

// start makes the key of a start of instance name, writes its key file and
// runtime configuration from rt, and registers it. rt's Sender, KeyFile
// and StartedAt are filled in.
func (r *registry) start(name string, rt localapi.Runtime, now time.Time) (*instance, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur, ok := r.m[name]; ok {
		return nil, fmt.Errorf("%w: an instance named %q runs on this machine (pid %d); stop it or choose another --name", errNameTaken, name, cur.pid.Load())
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("make the key of instance %q: %w", name, err)
	}
	defer clear(priv)
	in := &instance{name: name, key: pub, dir: filepath.Join(r.dir, name+"."+randomHex(4)), started: now}
	in.keyFile = filepath.Join(in.dir, instanceKeyFile)
	in.runtimeFile = filepath.Join(in.dir, runtimeFile)
	if err := os.Mkdir(in.dir, 0o700); err != nil {
		return nil, fmt.Errorf("make the directory of instance %q: %w", name, err)
	}
	rt.Sender, rt.KeyFile, rt.StartedAt = name, in.keyFile, now.UTC()
	if err := writeInstanceFiles(in, priv, &rt); err != nil {
		os.RemoveAll(in.dir)
		return nil, err
	}
	r.m[name] = in
	return in, nil
}

func writeInstanceFiles(in *instance, priv ed25519.PrivateKey, rt *localapi.Runtime) error {
	keyPEM, err := localapi.MarshalKey(priv)
	if err != nil {
		return err
	}
	defer clear(keyPEM)
	if err := writeNew(in.keyFile, keyPEM); err != nil {
		return fmt.Errorf("write the key file of instance %q: %w", in.name, err)
	}
	b, err := rt.Marshal()
	if err != nil {
		return err
	}
	if err := writeNew(in.runtimeFile, b); err != nil {
		return fmt.Errorf("write the runtime configuration of instance %q: %w", in.name, err)
	}
	return nil
}

// writeNew writes a new file of mode 0600.
func writeNew(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// end removes the files of in and unregisters it. The caller has forgotten
// its key first. The files go first, so that an instance no longer listed
// has no files left (Server.Close relies on it).
func (r *registry) end(in *instance) error {
	err := os.RemoveAll(in.dir)
	r.mu.Lock()
	if r.m[in.name] == in {
		delete(r.m, in.name)
	}
	r.mu.Unlock()
	if err != nil {
		return fmt.Errorf("remove the files of instance %q: %w", in.name, err)
	}
	return nil
}

// list returns the running instances, by name.
func (r *registry) list() []*instance {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*instance, 0, len(r.m))
	for _, in := range r.m {
		out = append(out, in)
	}
	slices.SortFunc(out, func(a, b *instance) int { return strings.Compare(a.name, b.name) })
	return out
}

func (r *registry) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
