package inventory

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/nodetrust/nodetrust/internal/fleetd/render"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/pki"
)

// Bounds of an inventory file.
const (
	// MaxFileBytes bounds a file (MaxNodes entries fit); it travels in
	// pieces of ChunkBytes in one admin call.
	MaxFileBytes = 16 << 20
	// ChunkBytes is the largest piece of a file in one message, within the
	// control plane's per-message limit.
	ChunkBytes = 48 << 10
	// MaxNodes bounds the entries of a file.
	MaxNodes = 20000
	// maxListed bounds the errors a ParseError lists.
	maxListed = 1000
	maxText   = 128
	maxRef    = 256
	maxMACs   = 64
	maxPins   = 8
)

// The EK-binding evidence sources (seed 003: "The binding comes from a
// receiving scan or a supplier record, not from the claim").
const (
	SourceReceivingScan  = "receiving-scan"
	SourceSupplierRecord = "supplier-record"
)

// The changelog's field names, in the order a plan shows them.
const (
	FieldSerial        = "serial"
	FieldProductUUID   = "product_uuid"
	FieldMACs          = "macs"
	FieldClass         = "class"
	FieldSite          = "site"
	FieldRole          = "role"
	FieldSwitchChassis = "expected_port.chassis"
	FieldSwitchPort    = "expected_port.port"
	FieldInstallDisk   = "install_disk"
	FieldEKPins        = "ek_binding.pins"
	FieldEKSource      = "ek_binding.source"
	FieldEKReference   = "ek_binding.reference"
)

// BindingFields are the fields that make up an EK binding: a binding is
// honoured only when a declarer wrote each of them last.
var BindingFields = []string{FieldEKPins, FieldEKSource, FieldEKReference}

// LineError is one problem of a file, at a line (0 when the file as a
// whole is wrong).
type LineError struct {
	Line int
	Msg  string
}

func (e LineError) String() string {
	if e.Line == 0 {
		return e.Msg
	}
	return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
}

// ParseError lists every problem of a file; a file with any is refused
// whole.
type ParseError struct {
	Errors []LineError
	// More counts the problems beyond those listed.
	More int
}

func (e *ParseError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "the inventory has %d errors; nothing was changed", len(e.Errors)+e.More)
	for _, le := range e.Errors {
		b.WriteString("\n  ")
		b.WriteString(le.String())
	}
	if e.More > 0 {
		fmt.Fprintf(&b, "\n  … and %d more", e.More)
	}
	return b.String()
}

type parser struct {
	classes []string
	errs    []LineError
	more    int
}

func (p *parser) errf(line int, format string, args ...any) {
	if len(p.errs) >= maxListed {
		p.more++
		return
	}
	p.errs = append(p.errs, LineError{line, fmt.Sprintf(format, args...)})
}

// Parse reads an inventory file (docs/inventory.md) and returns its
// declarations in file order, normalized: MACs and product UUIDs in lower
// case, lists sorted. classes are the machine classes a declaration may
// name. Any problem refuses the file whole: the error is a *ParseError
// listing every problem by line.
func Parse(data []byte, classes []string) ([]store.Declaration, error) {
	p := &parser{classes: classes}
	if len(data) > MaxFileBytes {
		p.errf(0, "the file is %d bytes, more than %d", len(data), MaxFileBytes)
		return nil, p.result()
	}
	if !utf8.Valid(data) {
		p.errf(0, "the file is not UTF-8")
		return nil, p.result()
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		p.errf(0, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
		return nil, p.result()
	}
	if len(doc.Content) == 0 {
		p.errf(0, "the file is empty: it needs version: 1 and nodes:")
		return nil, p.result()
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		p.errf(root.Line, "the file must be a mapping with version and nodes")
		return nil, p.result()
	}
	var nodes *yaml.Node
	version := false
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch k.Value {
		case "version":
			version = true
			if v.Kind != yaml.ScalarNode || v.Value != "1" {
				p.errf(v.Line, "version %q is not supported: this fleetd reads version 1", v.Value)
			}
		case "nodes":
			nodes = v
		default:
			p.errf(k.Line, "unknown key %q (the file has version and nodes)", k.Value)
		}
	}
	if !version {
		p.errf(root.Line, "version is missing (version: 1)")
	}
	var out []store.Declaration
	switch {
	case nodes == nil:
		p.errf(root.Line, "nodes is missing")
	case nodes.Kind == yaml.ScalarNode && nodes.Tag == "!!null":
	case nodes.Kind != yaml.SequenceNode:
		p.errf(nodes.Line, "nodes must be a list")
	case len(nodes.Content) > MaxNodes:
		p.errf(nodes.Line, "%d nodes, more than %d", len(nodes.Content), MaxNodes)
	default:
		out = p.nodes(nodes.Content)
	}
	if err := p.result(); err != nil {
		return nil, err
	}
	return out, nil
}

func (p *parser) result() error {
	if len(p.errs) == 0 {
		return nil
	}
	return &ParseError{Errors: p.errs, More: p.more}
}

// seen remembers where each unique value appeared first.
type seen map[string]int

func (s seen) check(p *parser, what, v string, line int) {
	if v == "" {
		return
	}
	if first, ok := s[v]; ok {
		p.errf(line, "%s %q is declared twice (first at line %d)", what, v, first)
		return
	}
	s[v] = line
}

func (p *parser) nodes(items []*yaml.Node) []store.Declaration {
	names, serials, uuids, macs, pins := seen{}, seen{}, seen{}, seen{}, seen{}
	out := make([]store.Declaration, 0, len(items))
	for _, it := range items {
		d, lines, ok := p.node(it)
		names.check(p, "name", d.Name, lines["name"])
		serials.check(p, "serial", d.Serial, lines[FieldSerial])
		uuids.check(p, "product_uuid", d.ProductUUID, lines[FieldProductUUID])
		for _, m := range d.MACs {
			macs.check(p, "MAC", m, lines[FieldMACs])
		}
		for _, pin := range d.EKPins {
			pins.check(p, "EK pin", pin, lines[FieldEKPins])
		}
		if ok {
			out = append(out, d)
		}
	}
	return out
}

var (
	macRE = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)
)

// node reads one entry; lines gives the line of each field for later
// checks.
func (p *parser) node(n *yaml.Node) (store.Declaration, map[string]int, bool) {
	var d store.Declaration
	lines := map[string]int{}
	if n.Kind != yaml.MappingNode {
		p.errf(n.Line, "a node must be a mapping (name: …)")
		return d, lines, false
	}
	before := len(p.errs) + p.more
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch k.Value {
		case "name":
			lines["name"] = v.Line
			d.Name = p.scalar(v, "name")
			if err := pki.ValidNodeID(d.Name); err != nil && d.Name != "" {
				p.errf(v.Line, "name: %v", err)
			}
		case FieldSerial:
			lines[k.Value] = v.Line
			d.Serial = p.text(v, k.Value, maxText)
		case FieldProductUUID:
			lines[k.Value] = v.Line
			d.ProductUUID = strings.ToLower(p.scalar(v, k.Value))
			if d.ProductUUID != "" && !pki.IsCanonicalUUID(d.ProductUUID) {
				p.errf(v.Line, "product_uuid %q is not a UUID (8-4-4-4-12 hex digits)", d.ProductUUID)
			}
		case FieldMACs:
			lines[k.Value] = v.Line
			for _, m := range p.list(v, k.Value, maxMACs) {
				m = strings.ToLower(m)
				if !macRE.MatchString(m) {
					p.errf(v.Line, "MAC %q is not six colon-separated hex bytes", m)
				}
				d.MACs = append(d.MACs, m)
			}
			slices.Sort(d.MACs)
		case FieldClass:
			lines[k.Value] = v.Line
			d.Class = p.scalar(v, k.Value)
			if d.Class != "" && !slices.Contains(p.classes, d.Class) {
				p.errf(v.Line, "class %q is not one of %s ([inventory] classes in fleetd.toml)", d.Class, strings.Join(p.classes, ", "))
			}
		case FieldSite:
			d.Site = p.text(v, k.Value, pki.MaxSiteLen)
		case FieldRole:
			d.Role = p.text(v, k.Value, pki.MaxRoleLen)
		case "expected_port":
			p.mapping(v, "expected_port", map[string]func(*yaml.Node){
				"chassis": func(v *yaml.Node) { d.SwitchChassis = p.text(v, FieldSwitchChassis, maxText) },
				"port":    func(v *yaml.Node) { d.SwitchPort = p.text(v, FieldSwitchPort, maxText) },
			})
			if (d.SwitchChassis == "") != (d.SwitchPort == "") {
				p.errf(v.Line, "expected_port needs both chassis and port")
			}
		case FieldInstallDisk:
			d.InstallDisk = p.scalar(v, k.Value)
			if d.InstallDisk != "" {
				if err := render.ValidInstallDisk(d.InstallDisk); err != nil {
					p.errf(v.Line, "install_disk %v", err)
				}
			}
		case "ek_binding":
			lines[FieldEKPins] = v.Line
			srcLine := v.Line
			p.mapping(v, "ek_binding", map[string]func(*yaml.Node){
				"pins": func(v *yaml.Node) {
					for _, pin := range p.list(v, FieldEKPins, maxPins) {
						if _, err := pki.ParsePin(pin); err != nil {
							p.errf(v.Line, "EK pin %q: %v", pin, err)
						}
						d.EKPins = append(d.EKPins, pin)
					}
					slices.Sort(d.EKPins)
				},
				"source":    func(v *yaml.Node) { d.EKSource, srcLine = p.scalar(v, FieldEKSource), v.Line },
				"reference": func(v *yaml.Node) { d.EKReference = p.text(v, FieldEKReference, maxRef) },
			})
			switch {
			case len(d.EKPins) == 0:
				p.errf(v.Line, "ek_binding needs pins: the sha256: pins of the EKs this machine may prove")
			case d.EKSource != SourceReceivingScan && d.EKSource != SourceSupplierRecord:
				p.errf(srcLine, "ek_binding source %q is not %s or %s: a binding comes from evidence, not from the machine's claim", d.EKSource, SourceReceivingScan, SourceSupplierRecord)
			}
		default:
			p.errf(k.Line, "unknown key %q in a node (see docs/inventory.md)", k.Value)
		}
	}
	if d.Name == "" {
		p.errf(n.Line, "a node needs a name")
	}
	if d.Class == "" {
		p.errf(n.Line, "node %q needs a class (%s)", d.Name, strings.Join(p.classes, ", "))
	}
	if d.Serial == "" && d.ProductUUID == "" {
		p.errf(n.Line, "node %q needs a serial or a product_uuid: the machine's claims select its declaration by them", d.Name)
	}
	return d, lines, len(p.errs)+p.more == before
}

func (p *parser) scalar(v *yaml.Node, what string) string {
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
		p.errf(v.Line, "%s must be a single value", what)
		return ""
	}
	return v.Value
}

// text reads a one-line printable value of at most max bytes.
func (p *parser) text(v *yaml.Node, what string, max int) string {
	s := p.scalar(v, what)
	if len(s) > max {
		p.errf(v.Line, "%s is %d bytes, more than %d", what, len(s), max)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			p.errf(v.Line, "%s holds a control character", what)
			break
		}
	}
	return s
}

func (p *parser) list(v *yaml.Node, what string, max int) []string {
	if v.Kind != yaml.SequenceNode {
		p.errf(v.Line, "%s must be a list", what)
		return nil
	}
	if len(v.Content) > max {
		p.errf(v.Line, "%s has %d items, more than %d", what, len(v.Content), max)
		return nil
	}
	var out []string
	for _, it := range v.Content {
		out = append(out, p.scalar(it, what))
	}
	return out
}

func (p *parser) mapping(v *yaml.Node, what string, fields map[string]func(*yaml.Node)) {
	if v.Kind != yaml.MappingNode {
		p.errf(v.Line, "%s must be a mapping", what)
		return
	}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k := v.Content[i]
		f, ok := fields[k.Value]
		if !ok {
			keys := make([]string, 0, len(fields))
			for name := range fields {
				keys = append(keys, name)
			}
			slices.Sort(keys)
			p.errf(k.Line, "unknown key %q in %s (%s)", k.Value, what, strings.Join(keys, ", "))
			continue
		}
		f(v.Content[i+1])
	}
}

// fieldValues returns a declaration's changelog fields and their text.
func fieldValues(d store.Declaration) [][2]string {
	return [][2]string{
		{FieldSerial, d.Serial}, {FieldProductUUID, d.ProductUUID}, {FieldMACs, strings.Join(d.MACs, ",")},
		{FieldClass, d.Class}, {FieldSite, d.Site}, {FieldRole, d.Role},
		{FieldSwitchChassis, d.SwitchChassis}, {FieldSwitchPort, d.SwitchPort}, {FieldInstallDisk, d.InstallDisk},
		{FieldEKPins, strings.Join(d.EKPins, ",")}, {FieldEKSource, d.EKSource}, {FieldEKReference, d.EKReference},
	}
}
