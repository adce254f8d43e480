package actuator

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// fakeReceiver is a webhook receiver (a test server standing in for the
// operator's automation): it records each request and answers status.
func fakeReceiver(t *testing.T, status int) (*httptest.Server, chan Cordon) {
	t.Helper()
	got := make(chan Cordon, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var c Cordon
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "want a JSON POST", http.StatusBadRequest)
			return
		}
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		got <- c
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return srv, got
}

func TestWebhookPostsTheCordon(t *testing.T) {
	srv, got := fakeReceiver(t, http.StatusAccepted)
	w, err := NewWebhook(WebhookConfig{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	if err := w.Cordon(t.Context(), Cordon{NodeID: "web-01", Class: "worker", Reason: "secure_boot: off", Time: now, RequestID: "r1"}); err != nil {
		t.Fatalf("Cordon: %v", err)
	}
	c := <-got
	if c.Action != "cordon" || c.NodeID != "web-01" || c.Class != "worker" || c.Reason != "secure_boot: off" || !c.Time.Equal(now) || c.RequestID != "r1" {
		t.Errorf("the receiver got %+v", c)
	}
}

func TestWebhookFailures(t *testing.T) {
	t.Run("a refusal by the receiver is an error naming its status", func(t *testing.T) {
		srv, _ := fakeReceiver(t, http.StatusServiceUnavailable)
		w, _ := NewWebhook(WebhookConfig{URL: srv.URL})
		if err := w.Cordon(t.Context(), Cordon{NodeID: "web-01"}); err == nil || !strings.Contains(err.Error(), "503") {
			t.Errorf("Cordon against a 503 = %v", err)
		}
	})
	t.Run("a receiver that is gone is an error naming its host, not the token in its path", func(t *testing.T) {
		srv, _ := fakeReceiver(t, http.StatusOK)
		srv.Close()
		w, _ := NewWebhook(WebhookConfig{URL: srv.URL + "/hooks/s3cr3t-token?key=s3cr3t-key"})
		err := w.Cordon(t.Context(), Cordon{NodeID: "web-01"})
		if err == nil {
			t.Fatal("Cordon against a closed receiver succeeded")
		}
		if strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), srv.Listener.Addr().String()) {
			t.Errorf("the error %q names the URL's secret, or not its host", err)
		}
	})
	t.Run("a redirect is not followed", func(t *testing.T) {
		target, got := fakeReceiver(t, http.StatusOK)
		redirect := httptest.NewServer(http.RedirectHandler(target.URL, http.StatusTemporaryRedirect))
		defer redirect.Close()
		w, _ := NewWebhook(WebhookConfig{URL: redirect.URL})
		if err := w.Cordon(t.Context(), Cordon{NodeID: "web-01"}); err == nil {
			t.Error("a redirected cordon succeeded")
		}
		if len(got) != 0 {
			t.Error("the redirect was followed")
		}
	})
}

func TestNewWebhookRefusesBadURLs(t *testing.T) {
	for _, u := range []string{"", "ftp://example.org/x", "/relative", "https://user:pw@example.org/hook", "http://"} {
		_, err := NewWebhook(WebhookConfig{URL: u})
		if err == nil {
			t.Errorf("NewWebhook(%q) succeeded", u)
		} else if strings.Contains(err.Error(), "pw@") {
			t.Errorf("NewWebhook(%q) = %v: the error repeats the URL's credentials", u, err)
		}
	}
}
