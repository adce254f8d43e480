package console

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/internal/fleetd/throttle"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// ContentSecurityPolicy is sent with every answer: nothing but the
// console's own style sheet and images, no script at all, forms posted
// only to the console, never framed.
const ContentSecurityPolicy = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Config is what a Console needs.
type Config struct {
	// Admin is the control plane's Admin API, dialled with the credential
	// the console acts as.
	Admin adminv1.AdminClient
	// Credential and Role name that credential; Role decides which action
	// buttons are shown (the API decides what is allowed).
	Credential string
	Role       roles.Role
	// Metrics reads the server's Prometheus text (GET /metrics); nil
	// leaves the figures page saying where they would come from.
	Metrics MetricsSource
	// MetricsFrom says where Metrics reads from, for the figures page.
	MetricsFrom string
	// Verdicts answers the node page's last boot checks; nil says that
	// this control plane records none.
	Verdicts VerdictSource
	// Addr is the host:port the console is served on: requests naming
	// another Host are refused (DNS rebinding).
	Addr string
	// Logger defaults to slog.Default. Login codes and session cookies are
	// never logged.
	Logger *slog.Logger
	// Now and Rand default to time.Now and crypto/rand.
	Now  func() time.Time
	Rand io.Reader
	// CodeTTL is how long the login code is valid; 0 means 15 minutes.
	CodeTTL time.Duration
	// SessionTTL is how long a session lasts; 0 means 8 hours.
	SessionTTL time.Duration
	// ScrapeEvery is how often Run reads the metrics; 0 means 10 s.
	ScrapeEvery time.Duration
	// Registry, when not nil, receives the console's own counters.
	Registry prometheus.Registerer
}

// Console serves the web console.
type Console struct {
	cfg      Config
	log      *slog.Logger
	pages    map[string]*template.Template
	auth     *auth
	figures  *figures
	refusals *prometheus.CounterVec
	reg      *prometheus.Registry
	// logLimit bounds the refusal log lines: 5 per reason a minute.
	logLimit *throttle.Limiter
}

// New builds a console and makes its login code (see LoginCode).
func New(cfg Config) (*Console, error) {
	if cfg.Admin == nil {
		return nil, errors.New("console: Admin is required")
	}
	if cfg.Addr == "" {
		return nil, errors.New("console: Addr is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Reader
	}
	if cfg.CodeTTL == 0 {
		cfg.CodeTTL = 15 * time.Minute
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = 8 * time.Hour
	}
	if cfg.ScrapeEvery == 0 {
		cfg.ScrapeEvery = 10 * time.Second
	}
	c := &Console{cfg: cfg, log: cfg.Logger.With("component", "console"), reg: prometheus.NewRegistry()}
	c.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodetrust_console_refusals_total",
		Help: "Console requests refused, by reason (csrf, login, session, host, origin, form).",
	}, []string{"reason"})
	for _, r := range []string{reasonCSRF, reasonLogin, reasonSession, reasonHost, reasonOrigin, reasonForm} {
		c.refusals.WithLabelValues(r)
	}
	c.reg.MustRegister(c.refusals)
	lim, err := throttle.New(throttle.Config{Window: time.Minute, Burst: 5, MaxKeys: 64, Now: cfg.Now})
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	c.logLimit = lim
	if cfg.Registry != nil {
		if err := cfg.Registry.Register(c.refusals); err != nil {
			return nil, fmt.Errorf("console: register metrics: %w", err)
		}
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	c.pages = pages
	_, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("console: Addr %q: %w", cfg.Addr, err)
	}
	a, err := newAuth(cfg.Rand, cfg.Now, cookiePrefix+port, cfg.CodeTTL, cfg.SessionTTL)
	if err != nil {
		return nil, err
	}
	c.auth = a
	c.figures = newFigures(cfg.Now)
	return c, nil
}

// LoginCode is the one-time code that opens a session, valid once and
// for Config.CodeTTL. Show it to the operator only; never log it.
func (c *Console) LoginCode() string { return c.auth.code }

// LoginURL is the address the operator opens: the login page with the
// code.
func (c *Console) LoginURL() string {
	return "http://" + c.cfg.Addr + "/login?code=" + c.auth.code
}

// Run reads the metrics every Config.ScrapeEvery until ctx ends.
func (c *Console) Run(ctx context.Context) error {
	if c.cfg.Metrics == nil {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(c.cfg.ScrapeEvery)
	defer t.Stop()
	for {
		c.scrape(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Handler serves the console.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /login", c.login)
	mux.Handle("GET /metrics", promhttp.HandlerFor(c.reg, promhttp.HandlerOpts{}))
	mux.Handle("POST /logout", c.form(c.logout))
	mux.Handle("GET /{$}", c.page(c.fleetPage))
	mux.Handle("GET /nodes/{id}", c.page(c.nodePage))
	mux.Handle("GET /nodes/{id}/confirm", c.page(c.confirmPage))
	mux.Handle("POST /nodes/{id}/action", c.form(c.nodeAction))
	mux.Handle("GET /pending", c.page(c.pendingPage))
	mux.Handle("GET /audit", c.page(c.auditPage))
	mux.Handle("GET /figures", c.page(c.figuresPage))
	return c.guard(mux)
}

// Refusal reasons, the label of nodetrust_console_refusals_total.
const (
	reasonCSRF    = "csrf"
	reasonLogin   = "login"
	reasonSession = "session"
	reasonHost    = "host"
	reasonOrigin  = "origin"
	reasonForm    = "form"
)

// refuse counts a refused request and answers it with a short page.
func (c *Console) refuse(w http.ResponseWriter, r *http.Request, reason string, code int, msg string) {
	c.refusals.WithLabelValues(reason).Inc()
	if ok, held := c.logLimit.Allow(reason, ""); ok {
		c.log.WarnContext(r.Context(), "console request refused", "reason", reason, "method", r.Method, "path", capPath(r.URL.Path), "not_logged_before", held)
	}
	c.renderError(w, code, msg)
}

// capPath bounds a request path before it is logged.
func capPath(p string) string {
	if len(p) > 128 {
		return p[:128] + "…"
	}
	return p
}

// guard sets the security headers on every answer and refuses a request
// for another Host (a DNS-rebinding page) or, for a form, from another
// Origin.
func (c *Console) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		if !sameHost(r.Host, c.cfg.Addr) {
			c.refuse(w, r, reasonHost, http.StatusMisdirectedRequest, "This console answers only at http://"+c.cfg.Addr+"/.")
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if o := r.Header.Get("Origin"); o != "" && o != "null" && o != "http://"+c.cfg.Addr {
				c.refuse(w, r, reasonOrigin, http.StatusForbidden, "Refused: the form came from another site.")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// sameHost reports whether a request's Host names the console's address
// (localhost for 127.0.0.1 included).
func sameHost(host, addr string) bool {
	if strings.EqualFold(host, addr) {
		return true
	}
	h, p, err := net.SplitHostPort(host)
	ah, ap, aerr := net.SplitHostPort(addr)
	if err != nil || aerr != nil || p != ap {
		return false
	}
	return strings.EqualFold(h, "localhost") && net.ParseIP(ah).IsLoopback()
}
