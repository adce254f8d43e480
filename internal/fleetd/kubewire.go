package fleetd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/nodetrust/nodetrust/internal/fleetd/config"
	"github.com/nodetrust/nodetrust/internal/fleetd/kube"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
)

// kubeWiring is what [kubernetes] makes (docs/kubernetes.md): the client,
// the approver's loop, the retirement of nodes from the cluster, and the
// cordon actuator when [actuator] kind = "kubernetes".
type kubeWiring struct {
	client   kubernetes.Interface
	retirer  *kubeRetirer
	cordoner *kube.Cordoner
}

// openKubernetes builds the wiring of [kubernetes], or nil without it;
// nodes is the store the retirer's sweep reads. The kubeconfig holds a
// credential: one others may read stops the start.
func openKubernetes(cfg *config.Fleetd, nodes store.Store, log *slog.Logger) (*kubeWiring, error) {
	k := cfg.Kubernetes
	if !k.Enabled() {
		if cfg.Actuator.Kind == config.ActuatorKubernetes {
			return nil, fmt.Errorf("actuator.kind = %q needs kubernetes.kubeconfig", config.ActuatorKubernetes)
		}
		return nil, nil
	}
	path := cfg.Resolve(k.Kubeconfig)
	if err := checkKubeconfig("kubernetes.kubeconfig", path); err != nil {
		return nil, err
	}
	client, err := kube.NewClient(path)
	if err != nil {
		return nil, fmt.Errorf("kubernetes.kubeconfig: %w", err)
	}
	w := &kubeWiring{client: client, retirer: &kubeRetirer{client: client, nodes: nodes, log: log.With("component", "kubernetes"),
		opts: kube.RetireOptions{DrainTimeout: k.DrainTimeout.Duration}, retry: k.RetireRetry.Duration}}
	if cfg.Actuator.Kind == config.ActuatorKubernetes {
		w.cordoner = kube.NewCordoner(client, cfg.BootPolicy.ControlPlaneClasses)
	}
	return w, nil
}

// approverMetrics counts the approver's decisions.
type approverMetrics struct {
	decisions *prometheus.CounterVec
	errors    prometheus.Counter
}

func newApproverMetrics(reg prometheus.Registerer) *approverMetrics {
	m := &approverMetrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodetrust_kube_csr_decisions_total",
			Help: "Kubelet client certificate requests decided, by decision (approved, denied, ignored: an ignored request is counted each time it is seen)."},
			[]string{"decision"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "nodetrust_kube_approver_errors_total",
			Help: "Failures of the bootstrap approver to read or decide requests (retried)."}),
	}
	for _, o := range []kube.Outcome{kube.Approved, kube.Denied, kube.Ignored} {
		m.decisions.WithLabelValues(string(o))
	}
	if reg != nil {
		reg.MustRegister(m.decisions, m.errors)
	}
	return m
}

// runApprover decides kubelet client requests until ctx ends, logging and
// counting each decision (a decision names the token's id, never its
// secret). A failure that repeats is logged once a minute.
func runApprover(ctx context.Context, a *kube.Approver, m *approverMetrics, log *slog.Logger) {
	var lastErr string
	var lastAt time.Time
	a.Run(ctx, func(d kube.Decision) {
		m.decisions.WithLabelValues(string(d.Outcome)).Inc()
		attrs := []any{"csr", d.CSR, "decision", string(d.Outcome), logkey.Reason, d.Reason, "token_id", d.TokenID,
			logkey.NodeID, d.Node, "requested_node", d.Requested, "detail", d.Detail}
		switch d.Outcome {
		case kube.Approved:
			log.InfoContext(ctx, "kubelet certificate request approved", attrs...)
		case kube.Denied:
			log.WarnContext(ctx, "kubelet certificate request denied", attrs...)
		case kube.Ignored:
			if d.Reason == kube.ReasonUnsignedToken {
				// A token labelled as fleetd's that fleetd did not sign:
				// someone else writing Secrets in kube-system.
				log.WarnContext(ctx, "kubelet certificate request with a bootstrap token labelled as fleetd's but not signed by it: left pending", attrs...)
				break
			}
			log.DebugContext(ctx, "kubelet certificate request ignored", attrs...)
		default:
			// Left for the controller manager; seen again on each change.
			log.DebugContext(ctx, "kubelet certificate request ignored", attrs...)
		}
	}, func(err error) {
		m.errors.Inc()
		if ctx.Err() != nil {
			return
		}
		if msg := err.Error(); msg != lastErr || time.Since(lastAt) > time.Minute {
			lastErr, lastAt = msg, time.Now()
			log.ErrorContext(ctx, "bootstrap approver: kubelet certificate requests wait until the cluster answers again; it retries every second", logkey.Error, err)
		}
	})
}

// kubeRetirer removes retired nodes from the cluster (kube.Retire): a
// retirement hook that queues the node and returns at once, so that a
// retirement never waits on the cluster; Loop works the queue and retries
// what failed (the API server down, a drain that timed out) every retry,
// with an error log and a metric each time. The queue is in memory; what
// a restart forgot, the sweep at the start of Loop finds again: a Node, or
// a token of fleetd's, named as a node the store says is retired.
type kubeRetirer struct {
	client kubernetes.Interface
	// nodes is the store, which the sweep asks for retired nodes; nil:
	// no sweep.
	nodes store.Store
	opts  kube.RetireOptions
	retry time.Duration
	log   *slog.Logger

	outcomes *prometheus.CounterVec
	pending  prometheus.Gauge

	mu    sync.Mutex
	queue []string
	wake  chan struct{}
	once  sync.Once
}

func (r *kubeRetirer) init() {
	r.once.Do(func() {
		r.wake = make(chan struct{}, 1)
		r.outcomes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodetrust_kube_retirements_total",
			Help: "Removals of retired nodes from the cluster (drain, Node, requests, tokens), by outcome (done, failed: retried)."}, []string{"outcome"})
		r.pending = prometheus.NewGauge(prometheus.GaugeOpts{Name: "nodetrust_kube_retirements_pending",
			Help: "Retired nodes whose removal from the cluster has not succeeded yet."})
		r.outcomes.WithLabelValues("done")
		r.outcomes.WithLabelValues("failed")
	})
}

// register adds the retirer's metrics to reg.
func (r *kubeRetirer) register(reg prometheus.Registerer) {
	r.init()
	reg.MustRegister(r.outcomes, r.pending)
}

// Name names the retirement hook.
func (r *kubeRetirer) Name() string { return "kubernetes" }

// Retired queues n's removal from the cluster. A node id that cannot name
// a Node has nothing there.
func (r *kubeRetirer) Retired(_ context.Context, n store.Node, _ string) error {
	r.init()
	if len(validation.IsDNS1123Subdomain(n.ID)) > 0 {
		return nil
	}
	r.mu.Lock()
	if !slices.Contains(r.queue, n.ID) {
		r.queue = append(r.queue, n.ID)
	}
	r.pending.Set(float64(len(r.queue)))
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return nil
}

// Loop works the queue until ctx ends: at once when a node is queued, and
// every retry while some removal failed. It sweeps first, and at each
// retry until a sweep succeeds.
func (r *kubeRetirer) Loop(ctx context.Context) {
	r.init()
	t := time.NewTicker(r.retry)
	defer t.Stop()
	swept := r.nodes == nil
	for {
		if !swept {
			if err := r.sweep(ctx); err != nil {
				if ctx.Err() == nil {
					r.log.WarnContext(ctx, "the sweep for retired nodes left in the cluster failed; retried", "retry", r.retry, logkey.Error, err)
				}
			} else {
				swept = true
			}
		}
		r.runQueue(ctx)
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-t.C:
		}
	}
}

// sweep queues each Node of the cluster, and each node with a bootstrap
// token of fleetd's, that the store says is retired: removals a restart
// of fleetd forgot.
func (r *kubeRetirer) sweep(ctx context.Context) error {
	names := map[string]bool{}
	nodes, err := r.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list Nodes: %w", err)
	}
	for _, n := range nodes.Items {
		names[n.Name] = true
	}
	tokens, err := r.client.CoreV1().Secrets(kube.TokenNamespace).List(ctx, metav1.ListOptions{LabelSelector: kube.NodeLabel})
	if err != nil {
		return fmt.Errorf("list bootstrap tokens: %w", err)
	}
	for _, s := range tokens.Items {
		names[s.Labels[kube.NodeLabel]] = true
	}
	for name := range names {
		n, err := r.nodes.GetNode(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("look up node %s: %w", name, err)
		}
		if n.State == store.StateRetired {
			_ = r.Retired(ctx, n, "")
		}
	}
	return nil
}

// runQueue tries each queued removal once, and reports how many are left.
func (r *kubeRetirer) runQueue(ctx context.Context) int {
	r.mu.Lock()
	nodes := slices.Clone(r.queue)
	r.mu.Unlock()
	for _, node := range nodes {
		if ctx.Err() != nil {
			break
		}
		res, err := kube.Retire(ctx, r.client, node, r.opts)
		if err != nil {
			r.outcomes.WithLabelValues("failed").Inc()
			r.log.ErrorContext(ctx, "ALERT: the retired node is not yet removed from the cluster; retried", logkey.NodeID, node, "retry", r.retry,
				"evicted", len(res.Evicted), "blocked", res.Blocked, "node_deleted", res.NodeDeleted, "csrs_deleted", res.CSRsDeleted,
				"tokens_deleted", res.TokensDeleted, logkey.Error, err)
			continue
		}
		r.outcomes.WithLabelValues("done").Inc()
		r.log.InfoContext(ctx, "retired node removed from the cluster", logkey.NodeID, node, "evicted", len(res.Evicted),
			"node_deleted", res.NodeDeleted, "csrs_deleted", res.CSRsDeleted, "tokens_deleted", res.TokensDeleted)
		r.mu.Lock()
		r.queue = slices.DeleteFunc(r.queue, func(s string) bool { return s == node })
		r.mu.Unlock()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending.Set(float64(len(r.queue)))
	return len(r.queue)
}
