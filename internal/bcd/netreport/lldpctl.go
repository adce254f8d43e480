// Package netreport reads the machine's LLDP neighbours — from
// `lldpctl -f json` when lldpd runs, or from a file holding the same JSON —
// and builds the network report (pki/netreport) that the node signs with
// its device key and sends with its request for installation.
package netreport

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/nodetrust/nodetrust/pki/netreport"
)

// Bounds of what is read.
const (
	// MaxInput bounds lldpctl's output or the file, in bytes.
	MaxInput = 1 << 20
	// MaxNeighbors bounds the neighbours one input may list.
	MaxNeighbors = 256
)

// ParseLLDPCtl reads the output of `lldpctl -f json` and returns every
// neighbour it lists, sorted by interface (stable for one interface with
// several neighbours).
//
// lldpctl's "json" format prints one interface as an object keyed by the
// interface name and several as an array of such objects; a chassis with a
// system name as an object keyed by that name, one without as the chassis
// fields themselves. Both shapes are read. A neighbour without a chassis
// id or a port id, or a field longer than netreport.MaxField, is an error:
// a report is never built from a part of what lldpd saw.
func ParseLLDPCtl(data []byte) ([]netreport.Neighbor, error) {
	if len(data) > MaxInput {
		return nil, fmt.Errorf("lldpctl output is %d bytes, more than %d", len(data), MaxInput)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("lldpctl output is not lldpctl -f json: %w", err)
	}
	lldp, ok := top["lldp"]
	if !ok {
		return nil, errors.New(`lldpctl output has no "lldp" object: is it lldpctl -f json?`)
	}
	var root map[string]json.RawMessage
	if err := json.Unmarshal(lldp, &root); err != nil {
		return nil, fmt.Errorf(`lldpctl output: "lldp" is not an object: %w`, err)
	}
	ifaces, ok := root["interface"]
	if !ok {
		return nil, nil // lldpd runs and has heard no neighbour
	}
	entries, err := objects(ifaces)
	if err != nil {
		return nil, fmt.Errorf(`lldpctl output: "interface": %w`, err)
	}
	var out []netreport.Neighbor
	for _, e := range entries {
		for _, name := range sortedKeys(e) {
			if len(out) >= MaxNeighbors {
				return nil, fmt.Errorf("lldpctl output lists more than %d neighbours", MaxNeighbors)
			}
			n, err := parseInterface(name, e[name])
			if err != nil {
				return nil, fmt.Errorf("lldpctl output: interface %.64q: %w", name, err)
			}
			out = append(out, n)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Interface < out[j].Interface })
	return out, nil
}

// objects reads v as one object or an array of objects.
func objects(v json.RawMessage) ([]map[string]json.RawMessage, error) {
	v = bytes.TrimSpace(v)
	if len(v) > 0 && v[0] == '[' {
		var list []map[string]json.RawMessage
		if err := json.Unmarshal(v, &list); err != nil {
			return nil, fmt.Errorf("not a list of objects: %w", err)
		}
		return list, nil
	}
	var one map[string]json.RawMessage
	if err := json.Unmarshal(v, &one); err != nil {
		return nil, fmt.Errorf("not an object: %w", err)
	}
	return []map[string]json.RawMessage{one}, nil
}

func sortedKeys(m map[string]json.RawMessage) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// parseInterface reads one interface's neighbour.
func parseInterface(name string, v json.RawMessage) (netreport.Neighbor, error) {
	var iface struct {
		Chassis json.RawMessage `json:"chassis"`
		Port    json.RawMessage `json:"port"`
	}
	if err := json.Unmarshal(v, &iface); err != nil {
		return netreport.Neighbor{}, fmt.Errorf("not an object: %w", err)
	}
	n := netreport.Neighbor{Interface: name}
	if len(iface.Chassis) == 0 {
		return n, errors.New("no chassis")
	}
	if len(iface.Port) == 0 {
		return n, errors.New("no port")
	}
	chassisName, chassis, err := chassisFields(iface.Chassis)
	if err != nil {
		return n, fmt.Errorf("chassis: %w", err)
	}
	n.ChassisName = chassisName
	if n.ChassisIDType, n.ChassisID, err = idTLV(chassis["id"]); err != nil {
		return n, fmt.Errorf("chassis id: %w", err)
	}
	var port map[string]json.RawMessage
	if err := json.Unmarshal(iface.Port, &port); err != nil {
		return n, fmt.Errorf("port: not an object: %w", err)
	}
	if n.PortIDType, n.PortID, err = idTLV(port["id"]); err != nil {
		return n, fmt.Errorf("port id: %w", err)
	}
	if n.PortDescr, err = optString(port["descr"]); err != nil {
		return n, fmt.Errorf("port descr: %w", err)
	}
	// The report's own checks (lengths, printable text) hold for every
	// neighbour parsed, so any of them can become a report.
	if err := n.Check(); err != nil {
		return n, err
	}
	return n, nil
}

// chassisFields returns the chassis' system name and its fields. A named
// chassis is {"<name>": {"id": …, …}}; an unnamed one is {"id": …, …}.
func chassisFields(v json.RawMessage) (string, map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(v, &m); err != nil {
		return "", nil, fmt.Errorf("not an object: %w", err)
	}
	if len(m) == 1 {
		for name, inner := range m {
			var fields map[string]json.RawMessage
			if json.Unmarshal(inner, &fields) == nil {
				if _, ok := fields["id"]; ok {
					return name, fields, nil
				}
			}
		}
	}
	if _, ok := m["id"]; ok {
		return "", m, nil
	}
	return "", nil, errors.New("no id")
}

// idTLV reads an id as lldpctl prints it: {"type": "mac", "value": "…"}.
func idTLV(v json.RawMessage) (typ, value string, err error) {
	if len(v) == 0 {
		return "", "", errors.New("missing")
	}
	var id struct {
		Type  *string `json:"type"`
		Value *string `json:"value"`
	}
	if err := json.Unmarshal(v, &id); err != nil {
		return "", "", fmt.Errorf(`not {"type", "value"}: %w`, err)
	}
	if id.Value == nil || strings.TrimSpace(*id.Value) == "" {
		return "", "", errors.New("no value")
	}
	if id.Type != nil {
		typ = *id.Type
	}
	return typ, *id.Value, nil
}

func optString(v json.RawMessage) (string, error) {
	if len(v) == 0 {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", fmt.Errorf("not a string: %w", err)
	}
	return s, nil
}
