// Package renderers builds the render.Registry of fleetd.toml's
// [render.CLASS] sections: a Talos renderer (package render/talos) or a
// template renderer per class. It is the one package that joins the
// configuration to the Talos machinery library, so only fleetd's wiring
// and commands import it.
package renderers

import (
	"fmt"
	"slices"

	"github.com/nodetrust/nodetrust/internal/fleetd/config"
	"github.com/nodetrust/nodetrust/internal/fleetd/render"
	"github.com/nodetrust/nodetrust/internal/fleetd/render/talos"
)

// Load makes each class's renderer: it reads template files and secrets
// bundles now, so a bad one stops fleetd at start with an error naming the
// setting (render.CLASS.key).
func Load(cfg *config.Fleetd) (*render.Registry, error) {
	classes := make([]string, 0, len(cfg.Render))
	for cl := range cfg.Render {
		classes = append(classes, cl)
	}
	slices.Sort(classes)
	byClass := make(map[string]render.Renderer, len(classes))
	for _, cl := range classes {
		r, err := load(cfg, cfg.Render[cl])
		if err != nil {
			return nil, fmt.Errorf("render.%s.%w", cl, err)
		}
		byClass[cl] = r
	}
	return render.NewRegistry(byClass), nil
}

func load(cfg *config.Fleetd, rc config.Render) (render.Renderer, error) {
	switch rc.Kind {
	case config.RenderTemplate:
		t, err := render.LoadTemplate(cfg.Resolve(rc.Template), rc.ContentType)
		if err != nil {
			return nil, fmt.Errorf("template: %w", err)
		}
		return t, nil
	case config.RenderTalos:
		return talos.New(talos.Settings{
			ClusterName: rc.ClusterName, ClusterEndpoint: rc.ClusterEndpoint, SecretsFile: cfg.Resolve(rc.SecretsFile),
			KubernetesVersion: rc.KubernetesVersion, TalosVersion: rc.TalosVersion, InstallImage: rc.InstallImage,
			ControlPlaneRoles: rc.ControlPlaneRoles, BCDDir: rc.BCDDir,
		})
	}
	return nil, fmt.Errorf("kind: %q is not %q or %q", rc.Kind, config.RenderTalos, config.RenderTemplate)
}
