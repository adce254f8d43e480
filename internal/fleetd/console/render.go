package console

import (
	"bytes"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"
)

// layout is what every page shows around its content.
type layout struct {
	Title      string
	Nav        string
	Credential string
	Role       string
	CSRF       string
	Flash      string
	Data       any
}

var funcs = template.FuncMap{
	"nodeURL": func(id string) string { return "/nodes/" + url.PathEscape(id) },
	"confirmURL": func(id, action string) string {
		return "/nodes/" + url.PathEscape(id) + "/confirm?action=" + url.QueryEscape(action)
	},
	"utc":     utc,
	"iso":     iso,
	"join":    strings.Join,
	"stateOf": stateOf,
}

// parsePages parses each page with the layout.
func parsePages() (map[string]*template.Template, error) {
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("console: list templates: %w", err)
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		base := path.Base(n)
		if base == "layout.html" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("console: parse %s: %w", n, err)
		}
		pages[strings.TrimSuffix(base, ".html")] = t
	}
	return pages, nil
}

// render writes page with data inside the layout.
func (c *Console) render(w http.ResponseWriter, status int, s *session, page, title, nav string, data any) {
	l := layout{Title: title, Nav: nav, Credential: c.cfg.Credential, Role: string(c.cfg.Role), Data: data}
	if s != nil {
		l.CSRF = s.csrf
		l.Flash = c.auth.takeFlash(s)
	}
	var b bytes.Buffer
	if err := c.pages[page].Execute(&b, l); err != nil {
		c.log.Error("render console page", "page", page, "error", err)
		http.Error(w, "the console could not render this page; see its log", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// renderError answers with a page that says msg (without the session's
// navigation).
func (c *Console) renderError(w http.ResponseWriter, status int, msg string) {
	c.render(w, status, nil, "message", http.StatusText(status), "", msg)
}

func utc(unix int64) string {
	if unix == 0 {
		return "never"
	}
	return time.Unix(unix, 0).UTC().Format("2006-01-02 15:04:05Z")
}

func iso(unix int64) string {
	if unix == 0 {
		return ""
	}
	return time.Unix(unix, 0).UTC().Format(time.RFC3339)
}

// ago says how long ago (or, negative, in how long) d is, briefly.
func ago(d time.Duration) string {
	in := d < 0
	if in {
		d = -d
	}
	var s string
	switch {
	case d < time.Minute:
		s = fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		s = fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		s = fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		s = fmt.Sprintf("%dd", int(d.Hours()/24))
	}
	if in {
		return "in " + s
	}
	return s + " ago"
}

// state is a lifecycle state as the console shows it: a word and an icon,
// never a colour alone.
type state struct {
	Name string
	Icon string
}

var stateIcons = map[string]string{
	"planned":      "○",
	"provisioning": "◔",
	"active":       "●",
	"quarantined":  "⚠",
	"revoked":      "✕",
	"retired":      "∅",
}

// stateOrder is the order counts are shown in.
var stateOrder = []string{"planned", "provisioning", "active", "quarantined", "revoked", "retired"}

func stateOf(name string) state {
	icon, ok := stateIcons[name]
	if !ok {
		icon = "?"
	}
	return state{Name: name, Icon: icon}
}
