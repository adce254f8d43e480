package render

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"text/template"
	"time"
)

// DefaultTemplateContentType is a template render's content type when the
// class names none.
const DefaultTemplateContentType = "text/plain; charset=utf-8"

// maxTemplateBytes bounds a template file.
const maxTemplateBytes = 1 << 20

// Template renders a class's config from a text/template file. A template
// that uses a fact the declaration does not have is refused: a missing
// key is an error, never "<no value>" or an empty string. The data are
// (docs/install.md):
//
//	.node.name .node.serial .node.product_uuid .node.macs .node.class
//	.node.site .node.role .node.install_disk
//	.node.expected_port.chassis .node.expected_port.port
//	.join_credential .join_credential_expires (RFC 3339)
//	.fleetd.server .fleetd.server_name .fleetd.serving_ca_spki_pin
//	.fleetd.join_signing_key_pin .fleetd.join_encryption_key_pin
//	.fleetd.join_encryption_jwk
//
// A fact that is not declared is absent; a template reads an optional one
// with the function optional (`{{optional .node "site"}}` is "" when
// absent). The function json writes a value as JSON, which is also a YAML
// scalar.
type Template struct {
	tmpl        *template.Template
	contentType string
}

// NewTemplate parses the template text of a class; name names it in
// errors (the file, or the setting).
func NewTemplate(name, text, contentType string) (*Template, error) {
	t, err := template.New(name).Option("missingkey=error").Funcs(template.FuncMap{"json": toJSON, "optional": optional}).Parse(text)
	if err != nil {
		return nil, fmt.Errorf("parse template: %w", err)
	}
	if contentType == "" {
		contentType = DefaultTemplateContentType
	}
	return &Template{tmpl: t, contentType: contentType}, nil
}

// LoadTemplate reads and parses a template file.
func LoadTemplate(path, contentType string) (*Template, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read template: %w", err)
	}
	defer f.Close()
	text, err := io.ReadAll(io.LimitReader(f, maxTemplateBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read template %s: %w", path, err)
	}
	if len(text) > maxTemplateBytes {
		return nil, fmt.Errorf("template %s is larger than %d bytes", path, maxTemplateBytes)
	}
	return NewTemplate(path, string(text), contentType)
}

// optional is m[key], or "" when m has no key.
func optional(m map[string]any, key string) any {
	if v, ok := m[key]; ok {
		return v
	}
	return ""
}

func toJSON(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		// Not wrapped: the error may describe the value.
		return "", errors.New("json: the value cannot be written as JSON")
	}
	return string(b), nil
}

// missingKeyRE finds the field of a missing-key error: `at <.node.site>:
// map has no entry for key "site"`.
var missingKeyRE = regexp.MustCompile(`at <\.([^>]*)>: map has no entry for key`)

// Render fills the template with in.
func (t *Template) Render(in Input) (Config, error) {
	if err := Check(in); err != nil {
		return Config{}, err
	}
	var b bytes.Buffer
	if err := t.tmpl.Execute(&b, templateData(in)); err != nil {
		msg := err.Error()
		if m := missingKeyRE.FindStringSubmatch(msg); m != nil {
			field := strings.TrimPrefix(m[1], "node.")
			return Config{}, &FieldError{Node: in.Node.Name, Field: field, Reason: "is not declared, and the class's template uses it"}
		}
		// A template error names the template's place, not data; drop the
		// credential all the same should a function have quoted it.
		msg = in.Redact(msg)
		return Config{}, fmt.Errorf("render node %s: %s", in.Node.Name, msg)
	}
	return Config{Data: b.Bytes(), ContentType: t.contentType, CredentialExpires: in.CredentialExpires}, nil
}

// templateData is the map a template reads: only declared facts are
// present, so a template that uses another fails.
func templateData(in Input) map[string]any {
	n := in.Node
	node := map[string]any{}
	set := func(m map[string]any, k, v string) {
		if v != "" {
			m[k] = v
		}
	}
	set(node, "name", n.Name)
	set(node, "serial", n.Serial)
	set(node, "product_uuid", n.ProductUUID)
	if len(n.MACs) > 0 {
		node["macs"] = n.MACs
	}
	set(node, "class", n.Class)
	set(node, "site", n.Site)
	set(node, "role", n.Role)
	set(node, "install_disk", n.InstallDisk)
	if n.SwitchChassis != "" || n.SwitchPort != "" {
		port := map[string]any{}
		set(port, "chassis", n.SwitchChassis)
		set(port, "port", n.SwitchPort)
		node["expected_port"] = port
	}
	f := in.Fleetd
	fleetd := map[string]any{}
	set(fleetd, "server", f.Server)
	set(fleetd, "server_name", f.ServerName)
	set(fleetd, "serving_ca_spki_pin", f.ServingCASPKIPin)
	set(fleetd, "join_signing_key_pin", f.JoinSigningKeyPin)
	set(fleetd, "join_encryption_key_pin", f.JoinEncryptionKeyPin)
	set(fleetd, "join_encryption_jwk", f.JoinEncryptionJWK)
	data := map[string]any{
		"node":                    node,
		"join_credential":         in.Credential,
		"join_credential_expires": in.CredentialExpires.UTC().Format(time.RFC3339),
		"fleetd":                  fleetd,
	}
	set(data, "kube_bootstrap_token", in.KubeBootstrapToken)
	return data
}
