package config

import (
	"strings"
	"testing"
)

const base = "pki_dir = \"p\"\ndata_dir = \"d\"\n"

func TestRenderSections(t *testing.T) {
	p := writeFile(t, base+`
[render.worker]
kind = "talos"
cluster_name = "lab"
cluster_endpoint = "https://k8s.example.org:6443"
secrets_file = "talos/secrets.yaml"
control_plane_roles = ["control-plane", "etcd"]

[render.install-environment]
kind = "template"
template = "templates/hook.ipxe"
content_type = "text/plain"
`)
	c, err := LoadFleetd(p)
	if err != nil {
		t.Fatal(err)
	}
	w := c.Render["worker"]
	if w.Kind != RenderTalos || w.ClusterName != "lab" || w.SecretsFile != "talos/secrets.yaml" || len(w.ControlPlaneRoles) != 2 {
		t.Errorf("[render.worker] %+v", w)
	}
	if ie := c.Render["install-environment"]; ie.Kind != RenderTemplate || ie.Template != "templates/hook.ipxe" {
		t.Errorf("[render.install-environment] %+v", ie)
	}
}

func TestRenderRefusals(t *testing.T) {
	talos := "kind = \"talos\"\ncluster_name = \"lab\"\ncluster_endpoint = \"https://k8s:6443\"\nsecrets_file = \"s.yaml\"\n"
	for _, tc := range []struct{ name, section, want string }{
		{"no kind", "[render.worker]\ntemplate = \"t\"\n", "render.worker.kind is required"},
		{"an unknown kind", "[render.worker]\nkind = \"ignition\"\n", "render.worker.kind: \"ignition\""},
		{"a class not declared", "[render.gpu]\nkind = \"template\"\ntemplate = \"t\"\n", "render.gpu: \"gpu\" is not one of inventory.classes"},
		{"a template without its file", "[render.worker]\nkind = \"template\"\n", "render.worker.template is required"},
		{"a talos setting on a template", "[render.worker]\nkind = \"template\"\ntemplate = \"t\"\nsecrets_file = \"s\"\n", "render.worker.secrets_file is not a setting of kind \"template\""},
		{"a template setting on talos", "[render.worker]\n" + talos + "content_type = \"x\"\n", "render.worker.content_type is not a setting of kind \"talos\""},
		{"talos without a cluster name", "[render.worker]\n" + strings.Replace(talos, "cluster_name = \"lab\"\n", "", 1), "render.worker.cluster_name is required"},
		{"talos without secrets", "[render.worker]\n" + strings.Replace(talos, "secrets_file = \"s.yaml\"\n", "", 1), "render.worker.secrets_file is required"},
		{"talos with an http endpoint", "[render.worker]\n" + strings.Replace(talos, "https://", "http://", 1), "render.worker.cluster_endpoint"},
		{"bcd_dir outside /var", "[render.worker]\n" + talos + "bcd_dir = \"/etc/bcd\"\n", "render.worker.bcd_dir"},
		{"a misspelt setting", "[render.worker]\n" + talos + "secret_file = \"x\"\n", "render.worker.secret_file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadFleetd(writeFile(t, base+tc.section))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
