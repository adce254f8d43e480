package localapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nodetrust/nodetrust/pki"
)

// EnvRuntime is the environment variable through which an instance started
// by bcd run finds its runtime configuration: the path of a JSON file.
const EnvRuntime = "NODETRUST_RUNTIME"

// RuntimeVersion is the format version of the runtime configuration.
const RuntimeVersion = 1

// MaxRuntimeLen is the largest runtime configuration ParseRuntime reads.
const MaxRuntimeLen = 64 << 10

// Runtime is the runtime configuration of one start of an instance: what
// it needs to sign its calls and to reach its daemon. The daemon writes it
// (mode 0600) when bcd run starts the instance, and removes it, with the key
// file, when the process ends.
type Runtime struct {
	Version int `json:"version"`
	// Namespace is the namespace the instance's calls are signed for.
	Namespace string `json:"namespace"`
	// NodeID is the node id of the daemon, the receiver of local calls and
	// the sender node of the instance's calls.
	NodeID string `json:"node_id"`
	// BootID is the instance id of the daemon's boot.
	BootID string `json:"boot_id"`
	// Socket is the path of the daemon's unix socket.
	Socket string `json:"socket"`
	// Sender is the instance's sender id: its name.
	Sender string `json:"sender"`
	// KeyFile is the path of the key file of this start (mode 0600).
	KeyFile string `json:"key_file"`
	// StartedAt is when the daemon made the key of this start.
	StartedAt time.Time `json:"started_at"`
}

// Validate checks that every field is there and well formed.
func (r *Runtime) Validate() error {
	switch {
	case r.Version != RuntimeVersion:
		return fmt.Errorf("runtime configuration: version %d, want %d", r.Version, RuntimeVersion)
	case r.Socket == "":
		return errors.New("runtime configuration: socket is missing")
	case r.KeyFile == "":
		return errors.New("runtime configuration: key_file is missing")
	}
	if err := ValidNamespace(r.Namespace); err != nil {
		return fmt.Errorf("runtime configuration: %w", err)
	}
	if err := pki.ValidNodeID(r.NodeID); err != nil {
		return fmt.Errorf("runtime configuration: %w", err)
	}
	if err := ValidSender(r.Sender); err != nil {
		return fmt.Errorf("runtime configuration: %w", err)
	}
	return nil
}

// Marshal returns the JSON of r as the daemon writes it.
func (r *Runtime) Marshal() ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode the runtime configuration: %w", err)
	}
	return append(b, '\n'), nil
}

// ParseRuntime decodes and validates a runtime configuration. It refuses
// unknown fields, so a configuration of a newer daemon is not misread.
func ParseRuntime(data []byte) (*Runtime, error) {
	if len(data) > MaxRuntimeLen {
		return nil, fmt.Errorf("runtime configuration: %d bytes, more than %d", len(data), MaxRuntimeLen)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var r Runtime
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("runtime configuration: %w", err)
	}
	if dec.More() {
		return nil, errors.New("runtime configuration: data after the JSON object")
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// ReadRuntime reads the runtime configuration at path.
func ReadRuntime(path string) (*Runtime, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the runtime configuration: %w", err)
	}
	r, err := ParseRuntime(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// RuntimeFromEnv reads the runtime configuration that NODETRUST_RUNTIME
// names.
func RuntimeFromEnv() (*Runtime, error) {
	path := os.Getenv(EnvRuntime)
	if path == "" {
		return nil, fmt.Errorf("%s is not set: start this program with bcd run -- PROGRAM, which gives it a runtime configuration and a key", EnvRuntime)
	}
	return ReadRuntime(path)
}
