package tinkerbell_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/nodetrust/nodetrust/internal/fleetd/bmc"
	"github.com/nodetrust/nodetrust/internal/fleetd/kube/kubetest"
	"github.com/nodetrust/nodetrust/internal/fleetd/provision"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/tinkerbell"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// tink's module, whose CRDs the tests install: read from the module cache
// (scripts/deps.sh downloads it; nothing of it is copied here).
const (
	tinkModule  = "github.com/tinkerbell/tink"
	tinkVersion = "v0.10.1"
)

var crdFiles = []string{"tinkerbell.org_hardware.yaml", "tinkerbell.org_templates.yaml", "tinkerbell.org_workflows.yaml"}

// waitTimeout bounds the wait for the CRDs to be established.
const waitTimeout = time.Minute

var crdOnce struct {
	sync.Once
	err error
}

// setup starts (or reuses) the cluster, installs tink's CRDs once, and
// returns a dynamic client and a namespace of this test's own.
func setup(t *testing.T) (dynamic.Interface, string) {
	t.Helper()
	dir, err := tinkDir()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("tink's CRDs: %v", err)
		}
		t.Skipf("tink's CRDs: %v", err)
	}
	c := kubetest.Start(t)
	dyn, err := dynamic.NewForConfig(c.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	crdOnce.Do(func() { crdOnce.err = installCRDs(c, dyn, dir) })
	if crdOnce.err != nil {
		t.Fatal(crdOnce.err)
	}
	ns := "tink-" + newRunID()
	if _, err := c.Admin(t).CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return dyn, ns
}

// tinkDir is tink's module folder in the module cache.
func tinkDir() (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", tinkModule+"@"+tinkVersion)
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s@%s is not in the module cache (make deps downloads it): %v", tinkModule, tinkVersion, err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil {
		return "", err
	}
	return m.Dir, nil
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// installCRDs applies tink's Hardware, Template and Workflow CRDs and
// waits until each is established.
func installCRDs(c *kubetest.Cluster, dyn dynamic.Interface, dir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for _, f := range crdFiles {
		b, err := os.ReadFile(filepath.Join(dir, "config", "crd", "bases", f))
		if err != nil {
			return err
		}
		if err := c.Apply(ctx, b); err != nil {
			return err
		}
	}
	for _, name := range []string{"hardware.tinkerbell.org", "templates.tinkerbell.org", "workflows.tinkerbell.org"} {
		w, err := dyn.Resource(crdResource).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
		if err != nil {
			return err
		}
		err = waitEstablished(ctx, w)
		w.Stop()
		if err != nil {
			return fmt.Errorf("CRD %s: %w", name, err)
		}
	}
	return nil
}

func waitEstablished(ctx context.Context, w watch.Interface) error {
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("not established: %w", ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				return errors.New("the watch ended before it was established")
			}
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
		}
	}
}

func newRunID() string {
	b := make([]byte, 5)
	for i := range b {
		var c [1]byte
		_, _ = rand.Read(c[:])
		b[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[int(c[0])%36]
	}
	return string(b)
}

const fleetdURL = "https://fleetd.example:8443"

func decl() store.Declaration {
	return store.Declaration{Name: "web-01", ProductUUID: "6A1F5C1E-0000-4000-8000-000000000001",
		MACs: []string{"3C:EC:EF:4C:4F:54", "3c-ec-ef-4c-4f-55"}, InstallDisk: "/dev/nvme0n1", Class: "worker", Role: "worker"}
}

func newProvisioner(t *testing.T, dyn dynamic.Interface, ns string, ctl bmc.Controller) *tinkerbell.Provisioner {
	t.Helper()
	p, err := tinkerbell.New(dyn, tinkerbell.Settings{Namespace: ns, ActionImage: "registry.example/nodetrust-provision:1", FleetdURL: fleetdURL,
		Installer: []string{"/usr/bin/install-talos"}}, ctl)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func get(t *testing.T, dyn dynamic.Interface, res schema.GroupVersionResource, ns, name string) *unstructured.Unstructured {
	t.Helper()
	o, err := dyn.Resource(res).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%s %s/%s: %v", res.Resource, ns, name, err)
	}
	return o
}

func str(t *testing.T, o *unstructured.Unstructured, path ...string) string {
	t.Helper()
	s, ok, err := unstructured.NestedString(o.Object, path...)
	if err != nil || !ok {
		t.Fatalf("%s %s: no string at %v (%v)", o.GetKind(), o.GetName(), path, err)
	}
	return s
}

// action is the Template's one action.
type action struct {
	Name        string            `yaml:"name"`
	Image       string            `yaml:"image"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
}

func templateAction(t *testing.T, tpl *unstructured.Unstructured) (worker string, vols []string, a action) {
	t.Helper()
	var data struct {
		Version string `yaml:"version"`
		Tasks   []struct {
			Worker  string   `yaml:"worker"`
			Volumes []string `yaml:"volumes"`
			Actions []action `yaml:"actions"`
		} `yaml:"tasks"`
	}
	if err := yaml.Unmarshal([]byte(str(t, tpl, "spec", "data")), &data); err != nil {
		t.Fatalf("the template's data: %v", err)
	}
	if data.Version != "0.1" || len(data.Tasks) != 1 || len(data.Tasks[0].Actions) != 1 {
		t.Fatalf("the template's data is not version 0.1 with one task of one action: %+v", data)
	}
	return data.Tasks[0].Worker, data.Tasks[0].Volumes, data.Tasks[0].Actions[0]
}

func TestApplyWritesTheObjectsWithTheGates(t *testing.T) {
	dyn, ns := setup(t)
	fake := &bmc.FakeBMC{}
	p := newProvisioner(t, dyn, ns, fake)
	d := decl()
	o, err := p.Apply(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	if o.Hardware != "web-01" || o.Template != "web-01" || o.Workflow != "web-01" || o.Namespace != ns || o.WorkflowReplaced {
		t.Fatalf("objects %+v", o)
	}

	hw := get(t, dyn, tinkerbell.HardwareResource, ns, "web-01")
	ifaces, _, _ := unstructured.NestedSlice(hw.Object, "spec", "interfaces")
	var macs []string
	for _, i := range ifaces {
		mac, _, _ := unstructured.NestedString(i.(map[string]any), "dhcp", "mac")
		pxe, _, _ := unstructured.NestedBool(i.(map[string]any), "netboot", "allowPXE")
		wf, _, _ := unstructured.NestedBool(i.(map[string]any), "netboot", "allowWorkflow")
		if !pxe || !wf {
			t.Errorf("interface %s may not PXE-boot or run workflows", mac)
		}
		macs = append(macs, mac)
	}
	if want := []string{"3c:ec:ef:4c:4f:54", "3c:ec:ef:4c:4f:55"}; !slices.Equal(macs, want) {
		t.Errorf("Hardware MACs %v, want %v", macs, want)
	}
	disks, _, _ := unstructured.NestedSlice(hw.Object, "spec", "disks")
	if len(disks) != 1 || disks[0].(map[string]any)["device"] != "/dev/nvme0n1" {
		t.Errorf("Hardware disks %v, want /dev/nvme0n1", disks)
	}
	if id := str(t, hw, "spec", "metadata", "instance", "id"); id != "6a1f5c1e-0000-4000-8000-000000000001" {
		t.Errorf("Hardware instance id %q, want the product UUID in lowercase", id)
	}
	if l := hw.GetLabels(); l[tinkerbell.ManagedByLabel] != tinkerbell.ManagedBy || l[tinkerbell.ProductUUIDLabel] != "6a1f5c1e-0000-4000-8000-000000000001" {
		t.Errorf("Hardware labels %v", l)
	}

	tpl := get(t, dyn, tinkerbell.TemplateResource, ns, "web-01")
	worker, vols, a := templateAction(t, tpl)
	if worker != "{{.device_1}}" {
		t.Errorf("the task's worker %q, want {{.device_1}}", worker)
	}
	for _, v := range []string{"/dev:/dev", "/run/nodetrust:/run/nodetrust:ro"} {
		if !slices.Contains(vols, v) {
			t.Errorf("the task's volumes %v lack %s", vols, v)
		}
	}
	if a.Image != "registry.example/nodetrust-provision:1" {
		t.Errorf("the action's image %q", a.Image)
	}
	script := a.Environment[tinkerbell.ScriptEnv]
	want, err := provision.Render(provision.Params{Device: d.Name, ProductUUID: d.ProductUUID, Disk: d.InstallDisk, FleetdURL: fleetdURL,
		Installer: []string{"/usr/bin/install-talos"}})
	if err != nil {
		t.Fatal(err)
	}
	if script != string(want) {
		t.Errorf("the action's script is not the provision script rendered for web-01:\n%s", script)
	}
	// The two gates, before the wipe.
	wipe := strings.Index(script, "wipefs")
	for _, gate := range []string{`private_file "$PASS_MARKER" "boot pass marker"`, `[ "${marker[0]}" = "nodetrust-boot-pass 1" ]`,
		`private_file "$CODE_FILE" "install code"`, `[[ $code =~ $CODE_PATTERN ]]`} {
		if i := strings.Index(script, gate); i < 0 || i > wipe {
			t.Errorf("the gate %s is not in the script before the wipe", gate)
		}
	}
	for _, p := range []string{provision.DefaultPassMarker, provision.DefaultCodeFile} {
		if !strings.Contains(script, p) {
			t.Errorf("the script does not name %s", p)
		}
	}
	if len(a.Command) != 3 || a.Command[0] != "/bin/bash" || !strings.Contains(a.Command[2], provision.DefaultCodeFile) || !strings.Contains(a.Command[2], "$"+tinkerbell.ScriptEnv) {
		t.Errorf("the action's command %q does not wait for the code file and run the script", a.Command)
	}
	refusesWithoutGates(t, a)

	wf := get(t, dyn, tinkerbell.WorkflowResource, ns, "web-01")
	if str(t, wf, "spec", "hardwareRef") != "web-01" || str(t, wf, "spec", "templateRef") != "web-01" ||
		str(t, wf, "spec", "hardwareMap", "device_1") != "3c:ec:ef:4c:4f:54" {
		t.Errorf("Workflow spec %v", wf.Object["spec"])
	}
	if n := len(fake.Actions()); n != 0 {
		t.Errorf("Apply made %d BMC calls, want none", n)
	}
}

// refusesWithoutGates runs the action's command as the agent would, on
// this machine, where there is neither a pass marker nor an install code:
// it must refuse (exit 3) and wipe nothing. The wait for the code is cut
// to one second.
func refusesWithoutGates(t *testing.T, a action) {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("bash is missing: the test runs the action's command")
		}
		t.Log("bash is not installed: the action's command is not run")
		return
	}
	for _, f := range []string{provision.DefaultPassMarker, provision.DefaultCodeFile} {
		if _, err := os.Lstat(f); err == nil {
			t.Logf("%s exists on this machine: the action's command is not run", f)
			return
		}
	}
	cmdText := strings.Replace(a.Command[2], "$(seq 600)", "$(seq 1)", 1)
	if cmdText == a.Command[2] {
		t.Fatalf("the command %q does not wait 600 s", a.Command[2])
	}
	wiped := filepath.Join(t.TempDir(), "wiped")
	wipe := filepath.Join(t.TempDir(), "wipe")
	if err := os.WriteFile(wipe, []byte("#!/bin/sh\ntouch "+wiped+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(a.Command[0], a.Command[1], cmdText)
	cmd.Env = append(os.Environ(), tinkerbell.ScriptEnv+"="+a.Environment[tinkerbell.ScriptEnv], "NODETRUST_WIPE_CMD="+wipe)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("the action ran with no gates: %v, want exit status 3; output:\n%s", err, out)
	}
	if !strings.Contains(string(out), "refusing to wipe /dev/nvme0n1: no boot pass marker") {
		t.Errorf("the refusal does not name the missing pass marker:\n%s", out)
	}
	if _, err := os.Stat(wiped); err == nil {
		t.Error("the wipe ran")
	}
}

func TestApplyAgainUpdates(t *testing.T) {
	dyn, ns := setup(t)
	p := newProvisioner(t, dyn, ns, nil)
	ctx := context.Background()
	d := decl()
	if _, err := p.Apply(ctx, d); err != nil {
		t.Fatal(err)
	}
	uids := map[string]string{}
	for _, res := range []schema.GroupVersionResource{tinkerbell.HardwareResource, tinkerbell.TemplateResource, tinkerbell.WorkflowResource} {
		uids[res.Resource] = string(get(t, dyn, res, ns, "web-01").GetUID())
	}
	d.InstallDisk = "/dev/sda"
	d.MACs = []string{"3c:ec:ef:4c:4f:56"}
	o, err := p.Apply(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if o.WorkflowReplaced {
		t.Error("a pending Workflow was replaced")
	}
	for _, res := range []schema.GroupVersionResource{tinkerbell.HardwareResource, tinkerbell.TemplateResource, tinkerbell.WorkflowResource} {
		l, err := dyn.Resource(res).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Items) != 1 || string(l.Items[0].GetUID()) != uids[res.Resource] {
			t.Errorf("%s: %d objects after a second Apply, want the first one updated", res.Resource, len(l.Items))
		}
	}
	hw := get(t, dyn, tinkerbell.HardwareResource, ns, "web-01")
	disks, _, _ := unstructured.NestedSlice(hw.Object, "spec", "disks")
	if len(disks) != 1 || disks[0].(map[string]any)["device"] != "/dev/sda" {
		t.Errorf("Hardware disks %v after the update, want /dev/sda", disks)
	}
	_, _, a := templateAction(t, get(t, dyn, tinkerbell.TemplateResource, ns, "web-01"))
	if !strings.Contains(a.Environment[tinkerbell.ScriptEnv], "readonly DISK='/dev/sda'") {
		t.Error("the template's script does not wipe the updated disk")
	}
	if got := str(t, get(t, dyn, tinkerbell.WorkflowResource, ns, "web-01"), "spec", "hardwareMap", "device_1"); got != "3c:ec:ef:4c:4f:56" {
		t.Errorf("Workflow device_1 %q after the update", got)
	}
}

func TestApplyReplacesAFinishedWorkflow(t *testing.T) {
	dyn, ns := setup(t)
	p := newProvisioner(t, dyn, ns, nil)
	ctx := context.Background()
	if _, err := p.Apply(ctx, decl()); err != nil {
		t.Fatal(err)
	}
	wf := get(t, dyn, tinkerbell.WorkflowResource, ns, "web-01")
	if err := unstructured.SetNestedField(wf.Object, "STATE_SUCCESS", "status", "state"); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(tinkerbell.WorkflowResource).Namespace(ns).UpdateStatus(ctx, wf, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	o, err := p.Apply(ctx, decl())
	if err != nil {
		t.Fatal(err)
	}
	if !o.WorkflowReplaced {
		t.Error("a finished Workflow was not replaced")
	}
	now := get(t, dyn, tinkerbell.WorkflowResource, ns, "web-01")
	if now.GetUID() == wf.GetUID() {
		t.Error("the Workflow is the finished one")
	}
	if s, _, _ := unstructured.NestedString(now.Object, "status", "state"); s != "" {
		t.Errorf("the new Workflow's state is %q, want none", s)
	}
}

func TestApplyLeavesForeignObjects(t *testing.T) {
	dyn, ns := setup(t)
	p := newProvisioner(t, dyn, ns, nil)
	ctx := context.Background()
	foreign := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "tinkerbell.org/v1alpha1", "kind": "Hardware",
		"metadata": map[string]any{"name": "web-01", "namespace": ns}, "spec": map[string]any{"disks": []any{map[string]any{"device": "/dev/keep"}}}}}
	if _, err := dyn.Resource(tinkerbell.HardwareResource).Namespace(ns).Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := p.Apply(ctx, decl())
	if err == nil || !strings.Contains(err.Error(), "not written by fleetd") {
		t.Fatalf("Apply over an operator's Hardware: %v, want a refusal", err)
	}
	hw := get(t, dyn, tinkerbell.HardwareResource, ns, "web-01")
	disks, _, _ := unstructured.NestedSlice(hw.Object, "spec", "disks")
	if len(disks) != 1 || disks[0].(map[string]any)["device"] != "/dev/keep" {
		t.Errorf("the operator's Hardware changed: %v", disks)
	}
	if _, err := dyn.Resource(tinkerbell.WorkflowResource).Namespace(ns).Get(ctx, "web-01", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a Workflow was written for a refused Hardware: %v", err)
	}
}

// checkingBMC is a FakeBMC that notes, at each call, whether the
// provision's Workflow exists already.
type checkingBMC struct {
	*bmc.FakeBMC
	dyn       dynamic.Interface
	ns        string
	mu        sync.Mutex
	workflows []bool
}

func (c *checkingBMC) note(ctx context.Context) {
	_, err := c.dyn.Resource(tinkerbell.WorkflowResource).Namespace(c.ns).Get(ctx, "web-01", metav1.GetOptions{})
	c.mu.Lock()
	c.workflows = append(c.workflows, err == nil)
	c.mu.Unlock()
}

func (c *checkingBMC) SetNextBoot(ctx context.Context, t bmc.Target, dev bmc.BootDevice) error {
	c.note(ctx)
	return c.FakeBMC.SetNextBoot(ctx, t, dev)
}

func (c *checkingBMC) PowerCycle(ctx context.Context, t bmc.Target) error {
	c.note(ctx)
	return c.FakeBMC.PowerCycle(ctx, t)
}

func TestStartBootsIntoTheWorkflow(t *testing.T) {
	dyn, ns := setup(t)
	ctl := &checkingBMC{FakeBMC: &bmc.FakeBMC{}, dyn: dyn, ns: ns}
	p := newProvisioner(t, dyn, ns, ctl)
	if _, err := p.Start(context.Background(), decl()); err != nil {
		t.Fatal(err)
	}
	target := bmc.Target{NodeID: "web-01", ProductUUID: "6a1f5c1e-0000-4000-8000-000000000001"}
	want := []bmc.Action{{Target: target, Kind: bmc.ActionSetNextBoot, Device: bmc.PXE}, {Target: target, Kind: bmc.ActionPowerCycle}}
	if got := ctl.Actions(); !slices.Equal(got, want) {
		t.Fatalf("BMC actions %+v, want %+v", got, want)
	}
	if !slices.Equal(ctl.workflows, []bool{true, true}) {
		t.Errorf("the Workflow existed at the BMC's calls: %v, want at both", ctl.workflows)
	}
}

func TestStartStopsAtABMCFailure(t *testing.T) {
	dyn, ns := setup(t)
	fake := &bmc.FakeBMC{Err: errors.New("BMC unreachable")}
	p := newProvisioner(t, dyn, ns, fake)
	_, err := p.Start(context.Background(), decl())
	if err == nil || !strings.Contains(err.Error(), "set the next boot of web-01 to PXE") {
		t.Fatalf("Start with a failing BMC: %v", err)
	}
	if got := fake.Actions(); len(got) != 1 {
		t.Errorf("BMC actions %+v after a failed set-next-boot, want no power cycle", got)
	}
}

func TestApplyRefusesAWorkflowBeingDeleted(t *testing.T) {
	dyn, ns := setup(t)
	p := newProvisioner(t, dyn, ns, nil)
	ctx := context.Background()
	if _, err := p.Apply(ctx, decl()); err != nil {
		t.Fatal(err)
	}
	r := dyn.Resource(tinkerbell.WorkflowResource).Namespace(ns)
	wf := get(t, dyn, tinkerbell.WorkflowResource, ns, "web-01")
	wf.SetFinalizers([]string{"example.org/hold"})
	if _, err := r.Update(ctx, wf, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := r.Delete(ctx, "web-01", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Apply(ctx, decl()); err == nil || !strings.Contains(err.Error(), "is being deleted") {
		t.Fatalf("Apply over a Workflow being deleted: %v, want a refusal to retry", err)
	}
	held := get(t, dyn, tinkerbell.WorkflowResource, ns, "web-01")
	held.SetFinalizers(nil)
	if _, err := r.Update(ctx, held, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Apply(ctx, decl()); err != nil {
		t.Fatalf("Apply once the Workflow is gone: %v", err)
	}
	if now := get(t, dyn, tinkerbell.WorkflowResource, ns, "web-01"); now.GetUID() == wf.GetUID() {
		t.Error("the Workflow is the deleted one")
	}
}
