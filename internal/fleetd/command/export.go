package command

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/fleetd/export"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/internal/fleetd/spireexport"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

func exportCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "export",
		Short: "The SPIRE registration export: show it, apply it to a SPIRE server, allow a held change",
		Long: `export serves the devices fleetd vouches for, and the retired ones, as registrations for a
SPIRE server (docs/spire.md). fleetd serve applies it on its own when [export.spire] names
the SPIRE server's socket; fleetd export spire applies it from anywhere fleetd's HTTPS
listener (http_listen) and the SPIRE server's admin socket can be reached.`,
	}
	c.AddCommand(exportShowCommand(), exportSPIRECommand(), exportAllowCommand(), exportHeldCommand())
	return c
}

// exportFlags are adminFlags plus the HTTPS listener's address.
type exportFlags struct {
	adminFlags
	https string
}

func (f *exportFlags) register(c *cobra.Command) {
	f.adminFlags.register(c)
	c.Flags().StringVar(&f.https, "https", os.Getenv("FLEETD_HTTPS"), "fleetd's HTTPS listener host:port; default: http_listen in fleetd.toml (env FLEETD_HTTPS)")
}

// exportClient calls the export endpoints with the admin credential.
type exportClient struct {
	base string
	http *http.Client
}

func (f *exportFlags) client() (*exportClient, error) {
	id, cfg, err := f.identity()
	if err != nil {
		return nil, err
	}
	addr := f.https
	if addr == "" && cfg != nil {
		addr = loopbackIfUnspecified(cfg.HTTPListen)
	}
	if addr == "" {
		return nil, cli.Usagef("fleetd's HTTPS address is unknown: give --https host:port (http_listen of the server)")
	}
	cert := id.cert
	tc := tlspin.Client(id.bundle.ServingCASPKIPin, id.bundle.ServerName, func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil })
	return &exportClient{base: "https://" + addr, http: &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}}}, nil
}

// do calls method path with body (JSON, or nil) and returns the answer's
// body; a refusal becomes an error with fleetd's message.
func (c *exportClient) do(ctx context.Context, method, path string, body any) ([]byte, http.Header, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w; is fleetd serving HTTPS (http_listen) there?", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, export.MaxBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		var e struct {
			Error string `json:"error"`
		}
		he := &httpError{status: resp.StatusCode, msg: fmt.Sprintf("%s %s: %s", method, path, resp.Status)}
		if json.Unmarshal(out, &e) == nil && e.Error != "" {
			he.msg = fmt.Sprintf("%s %s: %s (%s)", method, path, e.Error, resp.Status)
		}
		return nil, nil, he
	}
	return out, resp.Header, nil
}

// httpError is a refusal of an export endpoint.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

// Allowed and Record make the client the Safeguards of fleetd export
// spire. Allowed needs a credential that may apply the export: the
// applier asks it before it changes anything.
func (c *exportClient) Allowed(ctx context.Context, digest string) (bool, error) {
	b, _, err := c.do(ctx, http.MethodGet, service.ExportAllowedPath+"/"+url.PathEscape(digest), nil)
	if err != nil {
		return false, err
	}
	var a struct {
		Allowed bool `json:"allowed"`
	}
	if err := json.Unmarshal(b, &a); err != nil {
		return false, fmt.Errorf("allowance of %s: %w", digest, err)
	}
	return a.Allowed, nil
}

// heldAllowed says whether a held change was allowed, for a dry run
// (readable by an auditor).
func (c *exportClient) heldAllowed(ctx context.Context, digest string) (bool, error) {
	b, _, err := c.do(ctx, http.MethodGet, service.ExportHoldsPath+"/"+url.PathEscape(digest), nil)
	var he *httpError
	if errors.As(err, &he) && he.status == http.StatusNotFound {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var h service.ExportHoldJSON
	if err := json.Unmarshal(b, &h); err != nil {
		return false, fmt.Errorf("held change %s: %w", digest, err)
	}
	return h.AllowedAt != 0, nil
}

func (c *exportClient) Record(ctx context.Context, r export.Run) error {
	_, _, err := c.do(ctx, http.MethodPost, service.ExportRunsPath, r)
	return err
}

func exportShowCommand() *cobra.Command {
	var f exportFlags
	c := &cobra.Command{
		Use:   "show",
		Short: "Print the registration export (versioned JSON with its digest) (owner, operator, auditor)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := f.client()
			if err != nil {
				return err
			}
			b, _, err := cl.do(cmd.Context(), http.MethodGet, service.ExportPath, nil)
			if err != nil {
				return err
			}
			var pretty bytes.Buffer
			if json.Indent(&pretty, b, "", "  ") != nil {
				_, err = cmd.OutOrStdout().Write(b)
				return err
			}
			pretty.WriteByte('\n')
			_, err = cmd.OutOrStdout().Write(pretty.Bytes())
			return err
		},
	}
	f.register(c)
	return c
}

func exportSPIRECommand() *cobra.Command {
	var (
		f         exportFlags
		socket    string
		dryRun    bool
		threshold int
		pageSize  int
		from      string
	)
	c := &cobra.Command{
		Use:   "spire --socket PATH",
		Short: "Apply the export to a SPIRE server through its admin socket, with the safeguards (owner, operator; --dry-run: auditor too)",
		Long: `spire fetches the export from fleetd, checks its digest, and applies it to the SPIRE server
whose admin Unix socket is --socket: it creates and updates the fleet-owned entries (hint
"nodetrust"), deletes those of nodes that left the export, bans their agents unless another
registration still carries them, and bans retired nodes' agents on sight. Entries it did not
create are never touched.

Safeguards: an empty device list, or a malformed or unverifiable export, changes nothing; a
change that would withdraw or ban more nodes than --threshold waits until the owner allows
its digest (fleetd export allow --digest D). Each run is recorded in fleetd's audit trail
and metrics. --dry-run prints the diff and changes and records nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if socket == "" {
				return cli.Usagef("export spire needs --socket (the SPIRE server's admin socket, socket_path in its server.conf)")
			}
			var data []byte
			var sg spireexport.Safeguards
			// The run is recorded by fleetd, a --from file's too.
			cl, err := f.client()
			if err != nil {
				return err
			}
			sg = cl
			if from != "" {
				if data, err = os.ReadFile(from); err != nil {
					return fmt.Errorf("--from: %w", err)
				}
			} else if data, _, err = cl.do(cmd.Context(), http.MethodGet, service.ExportPath, nil); err != nil {
				return err
			}
			if dryRun {
				sg = dryRunSafeguards{cl}
			}
			spire, err := spireexport.Dial(socket, pageSize)
			if err != nil {
				return err
			}
			defer spire.Close()
			a := &spireexport.Applier{SPIRE: spire, Safeguards: sg, Threshold: threshold}
			res, err := a.Run(cmd.Context(), data, dryRun)
			if f.json {
				if perr := printJSON(cmd.OutOrStdout(), res); perr != nil {
					return perr
				}
			} else {
				printExportPlan(cmd.OutOrStdout(), res, dryRun)
			}
			if errors.Is(err, spireexport.ErrHeld) {
				return &cli.ExitError{Code: exitHeld, Err: err}
			}
			return err
		},
	}
	f.register(c)
	c.Flags().StringVar(&socket, "socket", "", "the SPIRE server's admin Unix socket (socket_path in server.conf)")
	c.Flags().BoolVar(&dryRun, "dry-run", false, "print the diff (create, update, delete, ban) and change nothing")
	c.Flags().IntVar(&threshold, "threshold", spireexport.DefaultThreshold, "how many nodes one run may withdraw or ban without the owner's allowance")
	c.Flags().IntVar(&pageSize, "page-size", spireexport.DefaultPageSize, "entries per SPIRE ListEntries page")
	c.Flags().StringVar(&from, "from", "", "apply this saved export file instead of fetching it (still checked and recorded)")
	return c
}

// exitHeld is export spire's exit code for a run a safeguard held.
const exitHeld = 3

// dryRunSafeguards answer allowances and record nothing.
type dryRunSafeguards struct{ c *exportClient }

func (d dryRunSafeguards) Allowed(ctx context.Context, digest string) (bool, error) {
	if d.c == nil {
		return false, nil
	}
	return d.c.heldAllowed(ctx, digest)
}

func (dryRunSafeguards) Record(context.Context, export.Run) error { return nil }

func printExportPlan(w io.Writer, res spireexport.Result, dryRun bool) {
	p, r := res.Plan, res.Run
	verb := "applied"
	if dryRun {
		verb = "would apply (dry run)"
	}
	fmt.Fprintf(w, "export %s: %s\n", orDash(r.Digest), r.Outcome)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range p.Create {
		fmt.Fprintf(tw, "create\t%s\t%s\t%v\n", c.Entry.ID, c.Entry.SPIFFEID, c.Entry.Selectors)
	}
	for _, c := range p.Update {
		fmt.Fprintf(tw, "update\t%s\t%s\t%v\n", c.Entry.ID, c.Entry.SPIFFEID, c.Entry.Selectors)
	}
	for _, c := range p.Delete {
		fmt.Fprintf(tw, "delete\t%s\t%s\t%v\n", c.Entry.ID, c.Entry.SPIFFEID, c.Entry.Selectors)
	}
	for _, b := range p.Ban {
		fmt.Fprintf(tw, "ban\t%s\tnode %s\t%s\n", b.AgentID, b.NodeID, b.Why)
	}
	for _, k := range p.Kept {
		fmt.Fprintf(tw, "keep\t%s\tnode %s\tcarried by %s\n", k.AgentID, k.NodeID, k.CarriedBy)
	}
	for _, x := range p.Pending {
		fmt.Fprintf(tw, "pending\t%s\tnode %s\tno attested agent to ban yet\n", orDash(x.AgentID), x.NodeID)
	}
	_ = tw.Flush()
	if r.Held != "" {
		fmt.Fprintf(w, "held: %s\n", r.Held)
	} else {
		fmt.Fprintf(w, "%s: %s\n", verb, r.Summary)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "error: %s\n", e)
	}
}

func exportAllowCommand() *cobra.Command {
	var (
		f      exportFlags
		digest string
		reason string
	)
	c := &cobra.Command{
		Use:   "allow --digest D --reason R",
		Short: "Allow a held export change by its digest (owner only; audited)",
		Long: `allow lets the next run apply the held change with digest D (see fleetd export held): an
export that withdraws or bans more nodes at once than the threshold. Only that exact export
is allowed: if the fleet changes, its digest changes and it is held again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if digest == "" || reason == "" {
				return cli.Usagef("export allow needs --digest and --reason")
			}
			cl, err := f.client()
			if err != nil {
				return err
			}
			b, _, err := cl.do(cmd.Context(), http.MethodPost, service.ExportAllowPath, service.ExportAllowRequest{Digest: digest, Reason: reason})
			if err != nil {
				return err
			}
			var h service.ExportHoldJSON
			if err := json.Unmarshal(b, &h); err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), h)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "export %s allowed by %s: %s\nthe next run applies it (fleetd export spire, or fleetd serve's own within [export.spire] interval)\n", h.Digest, h.AllowedBy, h.Detail)
			return nil
		},
	}
	f.register(c)
	c.Flags().StringVar(&digest, "digest", "", "the held export's digest (sha256:…)")
	c.Flags().StringVar(&reason, "reason", "", "why (recorded in the audit trail)")
	return c
}

func exportHeldCommand() *cobra.Command {
	var f exportFlags
	c := &cobra.Command{
		Use:   "held",
		Short: "List the export changes held back by the threshold, latest first (owner, operator, auditor)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := f.client()
			if err != nil {
				return err
			}
			b, _, err := cl.do(cmd.Context(), http.MethodGet, service.ExportHoldsPath, nil)
			if err != nil {
				return err
			}
			var hs []service.ExportHoldJSON
			if err := json.Unmarshal(b, &hs); err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), hs)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "DIGEST\tNODES\tDELETE\tBAN\tLAST HELD\tALLOWED BY\tDETAIL")
			for _, h := range hs {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\n", h.Digest, h.Nodes, h.Withdrawals, h.Bans, timeOrDash(h.LastHeld), orDash(h.AllowedBy), h.Detail)
			}
			return tw.Flush()
		},
	}
	f.register(c)
	return c
}
