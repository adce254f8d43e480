package launch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/nodetrust/nodetrust/localapi"
	"github.com/nodetrust/nodetrust/pki"
)

// Limits of a launch.
const (
	MaxMachines  = 1024
	MaxInstances = 4096
	// MaxFileLen is the largest launch file or JSON document Parse and
	// ParseJSON read.
	MaxFileLen = 1 << 20
)

// ErrNotPlaced means the launch does not place the instance on the node a
// call comes from.
var ErrNotPlaced = errors.New("not placed")

// Launch places named instances on machines.
type Launch struct {
	// Name names the launch in messages and in the daemon's status.
	Name string `toml:"name" json:"name"`
	// Machines are the machines of the launch, by node id.
	Machines map[string]Machine `toml:"machines" json:"machines"`
	// Instances are the instances of the launch, by name.
	Instances map[string]Instance `toml:"instances" json:"instances"`
}

// Machine is a machine of a launch.
type Machine struct {
	// Address is the federation address (host:port) of the machine's
	// daemon, where the daemons of the other machines send their calls.
	// Optional.
	Address string `toml:"address" json:"address,omitempty"`
}

// Instance is an instance of a launch.
type Instance struct {
	// Node is the node id of the machine the instance runs on.
	Node string `toml:"node" json:"node"`
}

// Parse reads a launch file (TOML) and validates it. It refuses a setting
// it does not know, so a misspelt key is an error.
func Parse(data []byte) (*Launch, error) {
	if len(data) > MaxFileLen {
		return nil, fmt.Errorf("launch file: %d bytes, more than %d", len(data), MaxFileLen)
	}
	var l Launch
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&l)
	if err != nil {
		return nil, fmt.Errorf("launch file: %w", err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("launch file: unknown setting %s", strings.Join(keys, ", "))
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return &l, nil
}

// ParseJSON reads a launch as JSON, the payload of launch/apply, and
// validates it.
func ParseJSON(data []byte) (*Launch, error) {
	if len(data) > MaxFileLen {
		return nil, fmt.Errorf("launch: %d bytes, more than %d", len(data), MaxFileLen)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var l Launch
	if err := dec.Decode(&l); err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	if dec.More() {
		return nil, errors.New("launch: data after the JSON object")
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return &l, nil
}

// Validate checks the launch, naming the first setting that is wrong.
func (l *Launch) Validate() error {
	if err := pki.ValidNodeID(l.Name); err != nil {
		return fmt.Errorf("launch name: %s", strings.Replace(err.Error(), "node id", "name", 1))
	}
	if len(l.Machines) > MaxMachines {
		return fmt.Errorf("launch %q: %d machines, more than %d", l.Name, len(l.Machines), MaxMachines)
	}
	if len(l.Instances) > MaxInstances {
		return fmt.Errorf("launch %q: %d instances, more than %d", l.Name, len(l.Instances), MaxInstances)
	}
	for _, node := range sortedKeys(l.Machines) {
		if err := pki.ValidNodeID(node); err != nil {
			return fmt.Errorf("launch %q: machines.%s: %w", l.Name, node, err)
		}
		if a := l.Machines[node].Address; a != "" {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return fmt.Errorf("launch %q: machines.%s.address: want host:port: %w", l.Name, node, err)
			}
		}
	}
	for _, name := range sortedKeys(l.Instances) {
		if err := localapi.ValidInstanceName(name); err != nil {
			return fmt.Errorf("launch %q: instances.%s: %w", l.Name, name, err)
		}
		node := l.Instances[name].Node
		if node == "" {
			return fmt.Errorf("launch %q: instances.%s.node is missing: the node id of the machine it runs on", l.Name, name)
		}
		if _, ok := l.Machines[node]; !ok {
			return fmt.Errorf("launch %q: instances.%s.node is %q, which is not under [machines]; add [machines.%s]", l.Name, name, node, node)
		}
	}
	return nil
}

// Check is the placement check: it returns nil when the launch places
// instance on node, else an error wrapping ErrNotPlaced that says where
// the launch places it.
func (l *Launch) Check(node, instance string) error {
	in, ok := l.Instances[instance]
	if !ok {
		return fmt.Errorf("%w: the launch %q places no instance %q; add [instances.%s] with node = %q to the launch file and run bcd launch again", ErrNotPlaced, l.Name, instance, instance, node)
	}
	if in.Node != node {
		return fmt.Errorf("%w: the launch %q places instance %q on node %q, not on node %q", ErrNotPlaced, l.Name, instance, in.Node, node)
	}
	return nil
}

// Address returns the federation address of node's daemon, or "".
func (l *Launch) Address(node string) string { return l.Machines[node].Address }

// Placed returns the names of the instances placed on node, sorted.
func (l *Launch) Placed(node string) []string {
	var names []string
	for _, name := range sortedKeys(l.Instances) {
		if l.Instances[name].Node == node {
			names = append(names, name)
		}
	}
	return names
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
