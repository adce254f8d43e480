package console

import (
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// cookiePrefix starts the session cookie's name, which ends with the
// console's port: browsers keep cookies by host, not port, so two consoles
// on one machine would otherwise end each other's sessions. The cookie is
// HttpOnly, SameSite=Strict, path /.
const cookiePrefix = "nodetrust_console_"

// maxSessions bounds the sessions held; the oldest goes first.
const maxSessions = 16

// auth holds the login code and the sessions it opened. The code is
// spent by its first use; a session carries its own CSRF token.
type auth struct {
	mu         sync.Mutex
	rand       io.Reader
	now        func() time.Time
	cookie     string
	code       string
	codeUntil  time.Time
	codeSpent  bool
	sessionTTL time.Duration
	sessions   map[string]*session
}

// session is one logged-in browser.
type session struct {
	id      string
	csrf    string
	created time.Time
	until   time.Time
	// flash is a message shown once, on the next page (an action's
	// outcome).
	flash string
}

func newAuth(rnd io.Reader, now func() time.Time, cookie string, codeTTL, sessionTTL time.Duration) (*auth, error) {
	code, err := randomToken(rnd)
	if err != nil {
		return nil, err
	}
	return &auth{rand: rnd, now: now, cookie: cookie, code: code, codeUntil: now().Add(codeTTL), sessionTTL: sessionTTL, sessions: map[string]*session{}}, nil
}

func randomToken(rnd io.Reader) (string, error) {
	b := make([]byte, 32)
	if _, err := io.ReadFull(rnd, b); err != nil {
		return "", fmt.Errorf("console: random token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// errCode is a login code that is wrong, spent or expired; the page says
// what to do.
var errCode = fmt.Errorf("this login code is not valid: it works once and for a limited time; restart 'fleetd console' for a new one")

// exchange spends the login code for a new session.
func (a *auth) exchange(code string) (*session, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if a.codeSpent || now.After(a.codeUntil) || subtle.ConstantTimeCompare([]byte(code), []byte(a.code)) != 1 {
		return nil, errCode
	}
	a.codeSpent = true
	id, err := randomToken(a.rand)
	if err != nil {
		return nil, err
	}
	csrf, err := randomToken(a.rand)
	if err != nil {
		return nil, err
	}
	if len(a.sessions) >= maxSessions {
		var oldest *session
		for _, s := range a.sessions {
			if oldest == nil || s.created.Before(oldest.created) {
				oldest = s
			}
		}
		delete(a.sessions, oldest.id)
	}
	s := &session{id: id, csrf: csrf, created: now, until: now.Add(a.sessionTTL)}
	a.sessions[id] = s
	return s, nil
}

// lookup returns the live session of a request's cookie, or nil.
func (a *auth) lookup(r *http.Request) *session {
	ck, err := r.Cookie(a.cookie)
	if err != nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.sessions[ck.Value]
	if s == nil {
		return nil
	}
	if a.now().After(s.until) {
		delete(a.sessions, s.id)
		return nil
	}
	return s
}

func (a *auth) end(s *session) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.sessions, s.id)
}

func (a *auth) setFlash(s *session, msg string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s.flash = msg
}

func (a *auth) takeFlash(s *session) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	f := s.flash
	s.flash = ""
	return f
}

// validCSRF reports whether token is the session's CSRF token.
func (s *session) validCSRF(token string) bool {
	return token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(s.csrf)) == 1
}

// login exchanges ?code= for a session cookie and goes to the fleet page.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	s, err := c.auth.exchange(r.URL.Query().Get("code"))
	if err != nil {
		c.refuse(w, r, reasonLogin, http.StatusUnauthorized, err.Error())
		return
	}
	http.SetCookie(w, &http.Cookie{Name: c.auth.cookie, Value: s.id, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Expires: s.until})
	c.log.InfoContext(r.Context(), "console session opened", "credential", c.cfg.Credential)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request, s *session) {
	c.auth.end(s)
	http.SetCookie(w, &http.Cookie{Name: c.auth.cookie, Value: "", Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, MaxAge: -1})
	c.renderError(w, http.StatusOK, "Logged out. Restart 'fleetd console' for a new login code.")
}

// pageFunc renders a page for a logged-in session.
type pageFunc func(w http.ResponseWriter, r *http.Request, s *session)

// page lets only a logged-in browser through.
func (c *Console) page(f pageFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := c.auth.lookup(r)
		if s == nil {
			c.refuse(w, r, reasonSession, http.StatusUnauthorized, "Not logged in: open the login address 'fleetd console' printed (it works once; restart it for another).")
			return
		}
		f(w, r, s)
	})
}

// maxForm bounds a form's body.
const maxForm = 16 << 10

// form lets through only a logged-in browser's form that carries the
// session's CSRF token.
func (c *Console) form(f pageFunc) http.Handler {
	return c.page(func(w http.ResponseWriter, r *http.Request, s *session) {
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		if err := r.ParseForm(); err != nil {
			c.refuse(w, r, reasonForm, http.StatusBadRequest, "The form could not be read (at most 16 KiB): "+err.Error())
			return
		}
		if !s.validCSRF(r.PostForm.Get("csrf")) {
			c.refuse(w, r, reasonCSRF, http.StatusForbidden, "Refused: the form has no valid CSRF token. Reload the page and submit the form again.")
			return
		}
		f(w, r, s)
	})
}
