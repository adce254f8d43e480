package tinkerbell

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"

	"github.com/nodetrust/nodetrust/internal/fleetd/bmc"
	"github.com/nodetrust/nodetrust/internal/fleetd/provision"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// The Tinkerbell resources fleetd writes: tink v0.10's tinkerbell.org
// v1alpha1, the served and stored version of its CRDs.
var (
	HardwareResource = schema.GroupVersionResource{Group: "tinkerbell.org", Version: "v1alpha1", Resource: "hardware"}
	TemplateResource = schema.GroupVersionResource{Group: "tinkerbell.org", Version: "v1alpha1", Resource: "templates"}
	WorkflowResource = schema.GroupVersionResource{Group: "tinkerbell.org", Version: "v1alpha1", Resource: "workflows"}
)

const apiVersion = "tinkerbell.org/v1alpha1"

// Labels on every object fleetd writes. An object of the same name without
// ManagedByLabel=ManagedBy is someone else's, and fleetd leaves it alone.
const (
	ManagedByLabel   = "app.kubernetes.io/managed-by"
	ManagedBy        = "nodetrust-fleetd"
	ProductUUIDLabel = "nodetrust.io/product-uuid"
)

// Defaults of Settings.
const (
	DefaultActionTimeout = 30 * time.Minute
	// DefaultCodeWait is how long the action waits for the install code
	// file before it runs the script (which refuses without it): the
	// Workflow exists before the install client has unwrapped the code.
	DefaultCodeWait = 10 * time.Minute
)

// Workflow states after which tink runs a Workflow no more.
var finishedStates = []string{"STATE_SUCCESS", "STATE_FAILED", "STATE_TIMEOUT"}

// Settings configure the objects.
type Settings struct {
	// Namespace holds the objects (Tinkerbell's own, often
	// "tink-system").
	Namespace string
	// ActionImage is the container image the provision action runs in:
	// it must hold bash, coreutils, wipefs and the installer.
	ActionImage string
	// FleetdURL is fleetd's HTTPS base URL the script hands the
	// installer; Installer the installer's program and arguments
	// (provision.Params).
	FleetdURL string
	Installer []string
	// ActionTimeout bounds the action (DefaultActionTimeout when zero);
	// CodeWait the wait for the install code (DefaultCodeWait when zero),
	// which must be shorter.
	ActionTimeout time.Duration
	CodeWait      time.Duration
}

// Provisioner writes a provision's objects and, with Start, boots the
// machine into them.
type Provisioner struct {
	client dynamic.Interface
	set    Settings
	bmc    bmc.Controller
}

// New returns a Provisioner writing with client; ctl may be nil when Start
// is never called.
func New(client dynamic.Interface, s Settings, ctl bmc.Controller) (*Provisioner, error) {
	if s.ActionTimeout <= 0 {
		s.ActionTimeout = DefaultActionTimeout
	}
	if s.CodeWait <= 0 {
		s.CodeWait = DefaultCodeWait
	}
	if errs := validation.IsDNS1123Label(s.Namespace); len(errs) > 0 {
		return nil, fmt.Errorf("tinkerbell: the namespace %.64q is not a Kubernetes namespace name: %s", s.Namespace, strings.Join(errs, "; "))
	}
	if s.ActionImage == "" {
		return nil, errors.New("tinkerbell: no action image (the image the provision script runs in)")
	}
	if s.CodeWait >= s.ActionTimeout {
		return nil, fmt.Errorf("tinkerbell: the wait for the install code (%s) must be shorter than the action's timeout (%s)", s.CodeWait, s.ActionTimeout)
	}
	s.Installer = slices.Clone(s.Installer)
	return &Provisioner{client: client, set: s, bmc: ctl}, nil
}

// Objects names what Apply wrote, in the Provisioner's namespace.
type Objects struct {
	Namespace string
	// Hardware, Template and Workflow are the objects' names: the node's
	// id for each.
	Hardware, Template, Workflow string
	// WorkflowReplaced is true when a finished Workflow was deleted and
	// created anew.
	WorkflowReplaced bool
}

// Apply creates or updates the Hardware, Template and Workflow of the
// provision of d, in that order. The objects are named after the node; an
// object of that name that fleetd did not write is an error, and is left
// unchanged.
func (p *Provisioner) Apply(ctx context.Context, d store.Declaration) (Objects, error) {
	hw, err := p.hardware(d)
	if err != nil {
		return Objects{}, err
	}
	tpl, err := p.template(d)
	if err != nil {
		return Objects{}, err
	}
	wf := p.workflow(d)
	o := Objects{Namespace: p.set.Namespace, Hardware: d.Name, Template: d.Name, Workflow: d.Name}
	if _, err := p.put(ctx, HardwareResource, hw); err != nil {
		return o, err
	}
	if _, err := p.put(ctx, TemplateResource, tpl); err != nil {
		return o, err
	}
	o.WorkflowReplaced, err = p.put(ctx, WorkflowResource, wf)
	return o, err
}

// Start writes the objects (Apply), then sets the machine's next boot to
// PXE and power-cycles it, so that it boots the install environment whose
// agent runs the Workflow. Not for a machine in the install environment:
// the cycle would end the boot its pass marker names.
func (p *Provisioner) Start(ctx context.Context, d store.Declaration) (Objects, error) {
	if p.bmc == nil {
		return Objects{}, errors.New("tinkerbell: no BMC controller: this control plane cannot power machines")
	}
	o, err := p.Apply(ctx, d)
	if err != nil {
		return o, err
	}
	t := bmc.Target{NodeID: d.Name, ProductUUID: strings.ToLower(d.ProductUUID)}
	if err := p.bmc.SetNextBoot(ctx, t, bmc.PXE); err != nil {
		return o, fmt.Errorf("set the next boot of %s to PXE: %w", d.Name, err)
	}
	if err := p.bmc.PowerCycle(ctx, t); err != nil {
		return o, fmt.Errorf("power-cycle %s: %w", d.Name, err)
	}
	return o, nil
}

// object returns a new object of kind named after d.
func (p *Provisioner) object(kind string, d store.Declaration, spec map[string]any) (*unstructured.Unstructured, error) {
	if errs := validation.IsDNS1123Subdomain(d.Name); len(errs) > 0 {
		return nil, fmt.Errorf("tinkerbell: the node name %.64q cannot name a %s: %s", d.Name, kind, strings.Join(errs, "; "))
	}
	o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind, "spec": spec}}
	o.SetName(d.Name)
	o.SetNamespace(p.set.Namespace)
	o.SetLabels(map[string]string{ManagedByLabel: ManagedBy, ProductUUIDLabel: strings.ToLower(d.ProductUUID)})
	return o, nil
}

// hardware is d's Hardware: one interface per declared MAC, each allowed
// to PXE-boot and run workflows, the install disk, and the product UUID
// as the instance id.
func (p *Provisioner) hardware(d store.Declaration) (*unstructured.Unstructured, error) {
	if len(d.MACs) == 0 {
		return nil, fmt.Errorf("tinkerbell: the declaration of %s has no MAC address, by which Tinkerbell knows the machine", d.Name)
	}
	if !path.IsAbs(d.InstallDisk) {
		return nil, fmt.Errorf("tinkerbell: the declaration of %s has no install disk (an absolute device path)", d.Name)
	}
	var ifaces []any
	for _, m := range d.MACs {
		mac, err := macText(m)
		if err != nil {
			return nil, fmt.Errorf("tinkerbell: the declaration of %s: %w", d.Name, err)
		}
		ifaces = append(ifaces, map[string]any{
			"dhcp":    map[string]any{"mac": mac, "hostname": d.Name},
			"netboot": map[string]any{"allowPXE": true, "allowWorkflow": true},
		})
	}
	return p.object("Hardware", d, map[string]any{
		"disks":      []any{map[string]any{"device": d.InstallDisk}},
		"interfaces": ifaces,
		"metadata":   map[string]any{"instance": map[string]any{"id": strings.ToLower(d.ProductUUID), "hostname": d.Name}},
	})
}

// macText is m as Tinkerbell writes a MAC: six lowercase hex pairs joined
// by colons.
func macText(m string) (string, error) {
	hw, err := net.ParseMAC(m)
	if err != nil || len(hw) != 6 {
		return "", fmt.Errorf("the MAC address %.32q is not 6 bytes", m)
	}
	return hw.String(), nil
}

// The template's action, in tink's template format (version 0.1).
type tplData struct {
	Version       string    `yaml:"version"`
	Name          string    `yaml:"name"`
	GlobalTimeout int64     `yaml:"global_timeout"`
	Tasks         []tplTask `yaml:"tasks"`
}

type tplTask struct {
	Name    string      `yaml:"name"`
	Worker  string      `yaml:"worker"`
	Volumes []string    `yaml:"volumes"`
	Actions []tplAction `yaml:"actions"`
}

type tplAction struct {
	Name        string            `yaml:"name"`
	Image       string            `yaml:"image"`
	Timeout     int64             `yaml:"timeout"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
}

// ScriptEnv is the action's environment variable that holds the provision
// script; the action's command waits for the install code file, then runs
// it with bash.
const ScriptEnv = "NODETRUST_PROVISION_SCRIPT"

// template is d's Template: one task on the machine's first MAC whose one
// action runs the provision script rendered for d, with /dev and the
// gates' folder (read-only) mounted.
func (p *Provisioner) template(d store.Declaration) (*unstructured.Unstructured, error) {
	script, err := provision.Render(provision.Params{Device: d.Name, ProductUUID: d.ProductUUID, Disk: d.InstallDisk,
		FleetdURL: p.set.FleetdURL, Installer: p.set.Installer})
	if err != nil {
		return nil, fmt.Errorf("tinkerbell: %w", err)
	}
	// tink renders the template's data with Go's text/template: the
	// script must not hold its delimiters.
	if strings.Contains(string(script), "{{") || strings.Contains(string(script), "}}") {
		return nil, fmt.Errorf("tinkerbell: the provision script of %s holds {{ or }}, which tink would read as its template's", d.Name)
	}
	gates := slices.Compact([]string{path.Dir(provision.DefaultPassMarker), path.Dir(provision.DefaultCodeFile)})
	vols := []string{"/dev:/dev"}
	for _, g := range gates {
		vols = append(vols, g+":"+g+":ro")
	}
	wait := fmt.Sprintf(`for _ in $(seq %d); do [ -e %s ] && break; sleep 1; done; exec /bin/bash -c "$%s" provision`,
		int64(p.set.CodeWait/time.Second), provision.DefaultCodeFile, ScriptEnv)
	data := tplData{Version: "0.1", Name: d.Name, GlobalTimeout: int64(p.set.ActionTimeout / time.Second), Tasks: []tplTask{{
		Name: "nodetrust-provision", Worker: "{{.device_1}}", Volumes: vols,
		Actions: []tplAction{{Name: "nodetrust-provision", Image: p.set.ActionImage, Timeout: int64(p.set.ActionTimeout / time.Second),
			Command: []string{"/bin/bash", "-c", wait}, Environment: map[string]string{ScriptEnv: string(script)}}},
	}}}
	b, err := yaml.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("tinkerbell: the template of %s: %w", d.Name, err)
	}
	return p.object("Template", d, map[string]any{"data": string(b)})
}

// workflow is d's Workflow: its Hardware and Template, the task's worker
// mapped to the first declared MAC.
func (p *Provisioner) workflow(d store.Declaration) *unstructured.Unstructured {
	mac, _ := macText(d.MACs[0]) // checked by hardware
	o, _ := p.object("Workflow", d, map[string]any{"templateRef": d.Name, "hardwareRef": d.Name,
		"hardwareMap": map[string]any{"device_1": mac}}) // the name is checked by hardware
	return o
}

// put creates obj or, when it exists and is fleetd's, sets its spec and
// labels. A Workflow in a finished state is deleted and created anew
// (replaced is then true), since tink never runs one again.
func (p *Provisioner) put(ctx context.Context, res schema.GroupVersionResource, obj *unstructured.Unstructured) (replaced bool, err error) {
	r := p.client.Resource(res).Namespace(p.set.Namespace)
	what := fmt.Sprintf("%s %s/%s", obj.GetKind(), p.set.Namespace, obj.GetName())
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := r.Get(ctx, obj.GetName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = r.Create(ctx, obj, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				// Created meanwhile: read it again.
				return apierrors.NewConflict(res.GroupResource(), obj.GetName(), err)
			}
			return err
		}
		if err != nil {
			return err
		}
		if cur.GetLabels()[ManagedByLabel] != ManagedBy {
			return fmt.Errorf("%s exists and was not written by fleetd (no label %s=%s): remove or rename it", what, ManagedByLabel, ManagedBy)
		}
		if cur.GetDeletionTimestamp() != nil {
			return fmt.Errorf("%s is being deleted (a finalizer holds it): retry once it is gone", what)
		}
		if res == WorkflowResource {
			state, _, _ := unstructured.NestedString(cur.Object, "status", "state")
			if slices.Contains(finishedStates, state) {
				uid := cur.GetUID()
				err := r.Delete(ctx, obj.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
				if err != nil && !apierrors.IsNotFound(err) {
					return fmt.Errorf("delete the finished %s (state %s): %w", what, state, err)
				}
				replaced = true
				return apierrors.NewConflict(res.GroupResource(), obj.GetName(), errors.New("deleted the finished workflow"))
			}
		}
		cur.Object["spec"] = obj.Object["spec"]
		labels := cur.GetLabels()
		for k, v := range obj.GetLabels() {
			labels[k] = v
		}
		cur.SetLabels(labels)
		_, err = r.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return replaced, fmt.Errorf("create or update %s: %w", what, err)
	}
	return replaced, nil
}
