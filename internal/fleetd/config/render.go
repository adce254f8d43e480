package config

import (
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"
)

// The kinds of renderer a [render.CLASS] section names.
const (
	RenderTalos    = "talos"
	RenderTemplate = "template"
)

// Render configures the renderer of one machine class: how its machine
// config is made for an install (docs/install.md, "Rendering"). Files are
// read when fleetd starts; relative paths resolve against fleetd.toml's
// folder.
type Render struct {
	// Kind is "talos" (a Talos machine config, made with Talos's
	// machinery library) or "template" (a text/template file).
	Kind string `toml:"kind"`

	// Template is the template file (kind template); ContentType the
	// media type its renders are served with (default text/plain).
	Template    string `toml:"template"`
	ContentType string `toml:"content_type"`

	// ClusterName, ClusterEndpoint (https://host:port of the Kubernetes
	// API) and SecretsFile (the cluster's secrets bundle, made once with
	// fleetd render secrets; mode 0600) are required with kind talos.
	ClusterName     string `toml:"cluster_name"`
	ClusterEndpoint string `toml:"cluster_endpoint"`
	SecretsFile     string `toml:"secrets_file"`
	// KubernetesVersion and TalosVersion (the version contract, "v1.11")
	// default to the machinery library's; InstallImage, empty by default,
	// leaves the installer image to Talos.
	KubernetesVersion string `toml:"kubernetes_version"`
	TalosVersion      string `toml:"talos_version"`
	InstallImage      string `toml:"install_image"`
	// ControlPlaneRoles are the declared roles rendered as control planes
	// (default ["control-plane"]); any other role is a worker.
	ControlPlaneRoles []string `toml:"control_plane_roles"`
	// BCDDir is where the config puts bcd's files on the machine: its
	// config.toml, the join encryption key and the join token (default
	// /var/etc/bcd; under /var/, where Talos writes machine files).
	BCDDir string `toml:"bcd_dir"`
}

// validateRender checks each [render.CLASS] section; an error names the
// setting.
func (c *Fleetd) validateRender() error {
	classes := make([]string, 0, len(c.Render))
	for cl := range c.Render {
		classes = append(classes, cl)
	}
	slices.Sort(classes)
	for _, cl := range classes {
		if err := c.Render[cl].validate(cl, c.Inventory.Classes); err != nil {
			return err
		}
	}
	return nil
}

func (r Render) validate(class string, classes []string) error {
	key := func(k string) string { return "render." + class + "." + k }
	if !slices.Contains(classes, class) {
		return fmt.Errorf("render.%s: %q is not one of inventory.classes (%s)", class, class, strings.Join(classes, ", "))
	}
	// set lists the settings given, so that one of the other kind is
	// named.
	talosOnly := map[string]bool{
		"cluster_name": r.ClusterName != "", "cluster_endpoint": r.ClusterEndpoint != "", "secrets_file": r.SecretsFile != "",
		"kubernetes_version": r.KubernetesVersion != "", "talos_version": r.TalosVersion != "", "install_image": r.InstallImage != "",
		"control_plane_roles": r.ControlPlaneRoles != nil, "bcd_dir": r.BCDDir != "",
	}
	templateOnly := map[string]bool{"template": r.Template != "", "content_type": r.ContentType != ""}
	other := func(settings map[string]bool, kind string) error {
		names := make([]string, 0, len(settings))
		for k, set := range settings {
			if set {
				names = append(names, k)
			}
		}
		if len(names) == 0 {
			return nil
		}
		slices.Sort(names)
		return fmt.Errorf("%s is not a setting of kind %q: remove it, or change kind", key(names[0]), kind)
	}
	switch r.Kind {
	case RenderTemplate:
		if err := other(talosOnly, r.Kind); err != nil {
			return err
		}
		if r.Template == "" {
			return fmt.Errorf("%s is required with kind = %q: the text/template file of the class's config", key("template"), r.Kind)
		}
	case RenderTalos:
		if err := other(templateOnly, r.Kind); err != nil {
			return err
		}
		switch {
		case r.ClusterName == "":
			return fmt.Errorf("%s is required with kind = %q", key("cluster_name"), r.Kind)
		case r.SecretsFile == "":
			return fmt.Errorf("%s is required with kind = %q: make the file once with 'fleetd render secrets --out FILE'", key("secrets_file"), r.Kind)
		}
		if u, err := url.Parse(r.ClusterEndpoint); err != nil || u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("%s: %q is not https://host:port, the Kubernetes API's address", key("cluster_endpoint"), r.ClusterEndpoint)
		}
		if r.BCDDir != "" && (!strings.HasPrefix(r.BCDDir, "/var/") || path.Clean(r.BCDDir) != r.BCDDir) {
			return fmt.Errorf("%s: %q must be a clean path under /var/: Talos creates machine files nowhere else", key("bcd_dir"), r.BCDDir)
		}
	case "":
		return fmt.Errorf("%s is required: %q or %q", key("kind"), RenderTalos, RenderTemplate)
	default:
		return fmt.Errorf("%s: %q is not %q or %q", key("kind"), r.Kind, RenderTalos, RenderTemplate)
	}
	return nil
}
