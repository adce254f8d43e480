package actuator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// Cordon is a request to stop scheduling new work on a node.
type Cordon struct {
	// Action is always "cordon".
	Action   string `json:"action"`
	NodeID   string `json:"node_id"`
	SPIFFEID string `json:"spiffe_id,omitempty"`
	Class    string `json:"class,omitempty"`
	// Reason says why: the failed rules of the verdict.
	Reason string    `json:"reason"`
	Time   time.Time `json:"time"`
	// RequestID is the id of the quarantine in the node's history.
	RequestID string `json:"request_id,omitempty"`
}

// Actuator carries out requests about nodes.
type Actuator interface {
	// Name names the actuator in logs and metrics.
	Name() string
	// Cordon requests that no new work be scheduled on the node. An
	// error means the request may not have been carried out.
	Cordon(ctx context.Context, c Cordon) error
}

// WebhookConfig configures [NewWebhook].
type WebhookConfig struct {
	// URL receives each request as a JSON POST; http or https.
	URL string
	// Timeout bounds one request (default 10 s).
	Timeout time.Duration
	// Client, when set, is the HTTP client (its Timeout is replaced);
	// default a new one.
	Client *http.Client
}

// Webhook posts each request as JSON to a URL; a 2xx answer is success.
type Webhook struct {
	url string
	// where is the URL's scheme and host: what errors name, since a
	// webhook's path or query often carries its token.
	where  string
	client *http.Client
}

var _ Actuator = (*Webhook)(nil)

// NewWebhook checks cfg and returns the webhook actuator.
func NewWebhook(cfg WebhookConfig) (*Webhook, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// The URL's path or query may carry the receiver's token: name
		// none of it.
		return nil, errors.New("actuator webhook URL: want an absolute http or https URL")
	}
	if u.User != nil {
		return nil, errors.New("actuator webhook URL: put no credentials in the URL")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	c := &http.Client{}
	if cfg.Client != nil {
		cc := *cfg.Client
		c = &cc
	}
	c.Timeout = cfg.Timeout
	// A redirect could send node data elsewhere: follow none.
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Webhook{url: u.String(), where: u.Scheme + "://" + u.Host, client: c}, nil
}

// Name is "webhook".
func (w *Webhook) Name() string { return "webhook" }

// Cordon posts c (Action set to "cordon") and returns an error unless the
// receiver answers 2xx.
func (w *Webhook) Cordon(ctx context.Context, c Cordon) error {
	c.Action = "cordon"
	body, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode the cordon request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("cordon request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.client.Do(req)
	if err != nil {
		// *url.Error names the whole URL: keep only the cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("post the cordon of node %s to %s: %w", c.NodeID, w.where, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("post the cordon of node %s: the webhook answered %s: %q", c.NodeID, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
