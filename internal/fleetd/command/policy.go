package command

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/internal/fleetd/config"
)

func policyCommand() *cobra.Command {
	c := &cobra.Command{Use: "policy", Short: "Test, capture and roll out boot policies (docs/boot-policy.md)"}
	c.AddCommand(policyCheckCommand(), policyCaptureCommand(), policyPromoteCommand(), policyStatusCommand())
	return c
}

// resolvePolicyDir is --dir, or boot_policy.dir of the fleetd.toml at configPath.
func resolvePolicyDir(dir, configPath string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	cfg, err := config.LoadFleetd(configPath)
	if err != nil {
		return "", fmt.Errorf("find the policy directory (or give --dir): %w", err)
	}
	if cfg.BootPolicy.Dir == "" {
		return "", cli.Usagef("%s names no boot_policy.dir: give --dir", configPath)
	}
	return cfg.Resolve(cfg.BootPolicy.Dir), nil
}

func policyCaptureCommand() *cobra.Command {
	var (
		class, description, logPath, pcrsPath, out, pinPCRs, node string
		af                                                        adminFlags
	)
	c := &cobra.Command{
		Use:   "capture --class C (--node ID | --log FILE --pcrs FILE) [--out FILE]",
		Short: "Write a class's boot policy from a golden machine's verified evidence, or its captured log and PCRs",
		Long: `capture writes a policy file for --class from one machine's measurement log and
PCR values 0-7: with --node, the last boot evidence fleetd verified for that
node (its tpm join, attested renewal or boot check: the quote, its PCR values
and the log, through the Admin API; owner, operator or auditor); else the log
and PCR values captured on the machine (as for policy check). The log must
replay to the PCR values. The policy requires Secure Boot when the machine
booted with it, allows the authorities that verified its boot applications,
pins every boot application measured into PCR 4, and pins the PCRs of
--pin-pcrs (0, 2 and 7 by default: firmware, option ROMs, Secure Boot policy).
Comments in the file say what was seen, which PCRs were left out and why (PCR 1
and 5 carry per-machine values such as a NIC's MAC on network boot or disk
GUIDs).

The policy is checked against the same evidence at once, at intake and at
renewal (with --node, the node's quote is verified as well): the machine it
came from must pass it, or nothing is written. The file goes to --out (never
over an existing file) or to standard output. Read it before you copy it into
the policy directory.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case class == "":
				return cli.Usagef("policy capture needs --class")
			case node != "" && (logPath != "" || pcrsPath != ""):
				return cli.Usagef("policy capture takes --node, or --log and --pcrs, not both")
			case node == "" && (logPath == "" || pcrsPath == ""):
				return cli.Usagef("policy capture needs --node, or --log and --pcrs")
			}
			opts := bootpolicy.CaptureOptions{Class: class, Description: description}
			if node != "" {
				ev, err := nodeEvidence(cmd, &af, node)
				if err != nil {
					return err
				}
				opts.EventLog, opts.PCRs, opts.Quote, opts.Source = ev.EventLog, ev.PCRs, ev.Quote, ev.source
			} else {
				ev, err := bootpolicy.ReadEvidenceFiles(logPath, pcrsPath)
				if err != nil {
					return err
				}
				opts.EventLog, opts.PCRs = ev.EventLog, ev.PCRs
				opts.Source = fmt.Sprintf("the log %s and the PCR values %s", logPath, pcrsPath)
			}
			opts.PinPCRs = []int{}
			for _, f := range strings.Split(pinPCRs, ",") {
				if f = strings.TrimSpace(f); f == "" {
					continue
				}
				i, err := strconv.Atoi(f)
				if err != nil || i < 0 || i > 7 {
					return cli.Usagef("--pin-pcrs: %q is not a PCR of the boot quote (0 to 7)", f)
				}
				opts.PinPCRs = append(opts.PinPCRs, i)
			}
			content, v, err := bootpolicy.Capture(opts)
			if err != nil {
				if v != nil {
					printVerdict(cmd.ErrOrStderr(), v)
				}
				return err
			}
			if out == "" {
				_, err := cmd.OutOrStdout().Write(content)
				return err
			}
			if err := bootpolicy.WriteNew(out, content); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: the machine passes it (%d rules); review it, then copy it into the policy directory\n", out, len(v.Rules))
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&class, "class", "", "the machine class the policy is for")
	f.StringVar(&description, "description", "", "the policy's description")
	f.StringVar(&node, "node", "", "capture from this node's last boot evidence fleetd verified (asks the server)")
	f.StringVar(&logPath, "log", "", "the golden machine's TCG event log (a copy of /sys/kernel/security/tpm0/binary_bios_measurements)")
	f.StringVar(&pcrsPath, "pcrs", "", "its SHA-256 PCR values 0-7, as tpm2_pcrread prints them")
	f.StringVar(&out, "out", "", "write the policy to this new file (default: standard output)")
	f.StringVar(&pinPCRs, "pin-pcrs", "0,2,7", "the PCRs whose values the policy pins, comma-separated (empty: none)")
	af.registerConnection(c)
	return c
}

// keptEvidence is a node's boot evidence as the server kept it.
type keptEvidence struct {
	bootpolicy.Evidence
	// source names it in a captured policy's header.
	source string
}

// nodeEvidence asks the server for node's last verified boot evidence
// (Admin GetBootEvidence) and notes on standard error when that evidence
// failed its policy.
func nodeEvidence(cmd *cobra.Command, af *adminFlags, node string) (*keptEvidence, error) {
	client, ctx, done, err := af.open(cmd)
	if err != nil {
		return nil, err
	}
	defer done()
	resp, err := client.GetBootEvidence(ctx, &adminv1.GetBootEvidenceRequest{NodeId: node})
	if err != nil {
		return nil, rpcError("boot evidence of node "+node, err)
	}
	return fromKept(cmd.ErrOrStderr(), node, resp.Evidence)
}

// fromKept turns the server's record of a node's evidence into
// bootpolicy's, with the quote, so that a capture verifies it again.
func fromKept(stderr io.Writer, node string, e *adminv1.BootEvidence) (*keptEvidence, error) {
	if e == nil {
		return nil, fmt.Errorf("the server sent no boot evidence of node %s", node)
	}
	pcrs := make(map[int][]byte, len(e.Pcrs))
	for i, v := range e.Pcrs {
		pcrs[int(i)] = v
	}
	at := time.Unix(0, e.TimeUnixNano).UTC().Format(time.RFC3339)
	result := "pass"
	if !e.Passed {
		result = "fail"
		fmt.Fprintf(stderr, "note: node %s's last evidence (%s, %s) failed its class %s policy: the captured policy accepts that boot; check it is the boot you want\n", node, e.Stage, at, e.Class)
	}
	ev := &keptEvidence{
		Evidence: bootpolicy.Evidence{PCRs: pcrs, EventLog: e.EventLog},
		source:   fmt.Sprintf("node %s's last verified boot evidence (%s at %s; it got %s under class %s)", node, e.Stage, at, result, e.Class),
	}
	if len(e.QuoteAttest) > 0 {
		ev.Quote = &bootpolicy.Quote{AKPublic: e.AkPublic, Attest: e.QuoteAttest, Signature: e.QuoteSignature, Nonce: e.Nonce}
	}
	return ev, nil
}

func policyPromoteCommand() *cobra.Command {
	var dir, configPath, class string
	c := &cobra.Command{
		Use:   "promote --class C",
		Short: "Make a class's [next] boot policy state current, retiring the old state",
		Long: `promote rewrites the policy file of --class so that its [next] state (a pending
firmware, shim, kernel or UKI update) becomes the current state: each rule
[next] gives replaces the current one, the others stay, and [next] is removed.
The file is checked before it replaces the old one atomically; the previous
file is kept beside it with the suffix .before-promote. The comments of the
previous file are NOT kept: the new file is regenerated (a header says so).

fleetd serve reads policies at start: restart it to apply the promotion. Run
policy status first: nodes that match only the current state fail after it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if class == "" {
				return cli.Usagef("policy promote needs --class")
			}
			d, err := resolvePolicyDir(dir, configPath)
			if err != nil {
				return err
			}
			ps, err := bootpolicy.Load(bootpolicy.Config{Dir: d})
			if err != nil {
				return err
			}
			p, err := ps.Policy(class)
			if err != nil {
				return err
			}
			pr, err := bootpolicy.Promote(p.File, time.Now())
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "promoted the next state of class %s in %s (previous file kept as %s; its comments are not in the new file)\n", class, pr.File, pr.Backup)
			switch {
			case pr.Early:
				fmt.Fprintf(w, "note: its window had not opened yet (not_before %s)\n", pr.Window.NotBefore.UTC().Format(time.RFC3339))
			case pr.Late:
				fmt.Fprintf(w, "note: its window had ended (not_after %s): boots of the new state failed until now\n", pr.Window.NotAfter.UTC().Format(time.RFC3339))
			}
			fmt.Fprintln(w, "restart fleetd serve to apply it")
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&dir, "dir", "", "the policy directory (default: boot_policy.dir of --config)")
	f.StringVar(&configPath, "config", envOr("FLEETD_CONFIG", "fleetd.toml"), "fleetd.toml, for boot_policy.dir (env FLEETD_CONFIG)")
	f.StringVar(&class, "class", "", "the machine class whose policy to promote")
	return c
}

func policyStatusCommand() *cobra.Command {
	var (
		verdictsDir, class string
		local              bool
		af                 adminFlags
	)
	c := &cobra.Command{
		Use:   "status [--class C] [--local | --verdicts DIR]",
		Short: "Count the nodes of each class whose latest boot verdict matched the current or the next state",
		Long: `status counts per class the nodes whose latest boot verdict matched the current
state of their policy, the next state, both (inside a [next] window), or
failed. Before policy promote, "current" must be 0 (or those nodes accepted as
failing after it).

By default it asks the server (Admin PolicyStatus; owner, operator or auditor),
which counts the latest verdict the store holds for each node that is not
retired: the whole fleet, whichever replica judged it. With --local, or
--verdicts DIR, it reads a verdict log instead (verdicts.jsonl and its rotated
files; --local: in data_dir of --config), without a server: the verdicts of
the server that wrote that log, deleted and retired nodes included.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var st []bootpolicy.ClassStatus
			if local || verdictsDir != "" {
				dir := verdictsDir
				if dir == "" {
					cfg, err := config.LoadFleetd(af.config)
					if err != nil {
						return fmt.Errorf("find the data directory (or give --verdicts): %w", err)
					}
					dir = cfg.Resolve(cfg.DataDir)
				}
				vs, bad, err := bootpolicy.ReadVerdictLogs(dir)
				if err != nil {
					return err
				}
				if bad > 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "note: %d lines of the verdict log did not parse and were skipped\n", bad)
				}
				for _, s := range bootpolicy.CountStatus(vs) {
					if class == "" || s.Class == class {
						st = append(st, s)
					}
				}
			} else {
				client, ctx, done, err := af.open(cmd)
				if err != nil {
					return err
				}
				defer done()
				resp, err := client.PolicyStatus(ctx, &adminv1.PolicyStatusRequest{Class: class})
				if err != nil {
					return rpcError("policy status", err)
				}
				for _, c := range resp.Classes {
					st = append(st, bootpolicy.ClassStatus{Class: c.Class, Nodes: int(c.Nodes), Current: int(c.Current), Next: int(c.Next),
						Both: int(c.Both), Failing: int(c.Failing), Latest: time.Unix(0, c.LatestUnixNano).UTC()})
				}
			}
			w := cmd.OutOrStdout()
			if af.json {
				return printJSON(w, st)
			}
			fmt.Fprintf(w, "%-20s %6s %8s %6s %6s %8s  %s\n", "CLASS", "NODES", "CURRENT", "NEXT", "BOTH", "FAILING", "LATEST VERDICT")
			for _, s := range st {
				fmt.Fprintf(w, "%-20s %6d %8d %6d %6d %8d  %s\n", s.Class, s.Nodes, s.Current, s.Next, s.Both, s.Failing, s.Latest.UTC().Format(time.RFC3339))
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&verdictsDir, "verdicts", "", "read the verdict log in this folder (holding verdicts.jsonl) instead of asking the server")
	f.BoolVar(&local, "local", false, "read the verdict log in data_dir of --config instead of asking the server")
	f.StringVar(&class, "class", "", "show this class only")
	af.register(c)
	return c
}

func policyCheckCommand() *cobra.Command {
	var (
		dir, configPath, class, stage, logPath, pcrsPath string
		asJSON                                           bool
	)
	c := &cobra.Command{
		Use:   "check --class C --log FILE --pcrs FILE",
		Short: "Evaluate a machine's captured event log and PCRs against a class's boot policy, offline",
		Long: `check loads every policy of the policy directory, as fleetd serve does, and
evaluates a machine's measurement log and PCR values 0-7 against the policy of
--class, without a server: test a policy on captured boots before you deploy it.

Capture on the machine (as root; docs/boot-policy.md):
  cp /sys/kernel/security/tpm0/binary_bios_measurements boot.log
  tpm2_pcrread sha256:0,1,2,3,4,5,6,7 > pcrs.txt

The PCR values are taken as given (no quote is verified). The verdict names
every rule that failed. Exit status: 0 when the verdict passes, 1 when it fails
or the check cannot be made, 2 for a command-line mistake.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if class == "" || logPath == "" || pcrsPath == "" {
				return cli.Usagef("policy check needs --class, --log and --pcrs")
			}
			st := bootpolicy.Stage(stage)
			switch st {
			case bootpolicy.Intake, bootpolicy.Renewal, bootpolicy.BootCheck:
			default:
				return cli.Usagef("--stage %q: want intake, renewal or boot-check", stage)
			}
			dir, err := resolvePolicyDir(dir, configPath)
			if err != nil {
				return err
			}
			ps, err := bootpolicy.Load(bootpolicy.Config{Dir: dir})
			if err != nil {
				return err
			}
			ev, err := bootpolicy.ReadEvidenceFiles(logPath, pcrsPath)
			if err != nil {
				return err
			}
			v, err := ps.Evaluate(class, st, ev)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if err := printJSON(out, v); err != nil {
					return err
				}
			} else {
				printVerdict(out, v)
			}
			if !v.Pass() {
				return &cli.ExitError{Code: cli.ExitFailure}
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&dir, "dir", "", "the policy directory (default: boot_policy.dir of --config)")
	f.StringVar(&configPath, "config", envOr("FLEETD_CONFIG", "fleetd.toml"), "fleetd.toml, for boot_policy.dir (env FLEETD_CONFIG)")
	f.StringVar(&class, "class", "", "the machine class whose policy applies")
	f.StringVar(&stage, "stage", string(bootpolicy.Renewal), "intake (a first join: intake_required_authorities), renewal or boot-check (renew_required_authorities)")
	f.StringVar(&logPath, "log", "", "the machine's TCG event log (a copy of /sys/kernel/security/tpm0/binary_bios_measurements)")
	f.StringVar(&pcrsPath, "pcrs", "", "its SHA-256 PCR values 0-7, as tpm2_pcrread prints them")
	f.BoolVar(&asJSON, "json", false, "print the verdict as JSON (the format of verdicts.jsonl)")
	return c
}

// printVerdict writes a verdict for a person: the outcome, every rule,
// the notes, and what the log says of the boot.
func printVerdict(w io.Writer, v *bootpolicy.Verdict) {
	result := "PASS"
	if !v.Pass() {
		result = "FAIL: " + strings.Join(v.Failed, ", ")
	}
	fmt.Fprintf(w, "class %s, stage %s, policy %s\n%s\n", v.Class, v.Stage, v.Policy, result)
	for _, r := range v.Rules {
		mark := "ok  "
		if !r.Pass {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s %-28s %s\n", mark, r.Rule, r.Detail)
	}
	for _, n := range v.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	b := v.Boot
	if b == nil {
		return
	}
	fmt.Fprintf(w, "boot: Secure Boot %s; PK %d, KEK %d, db %d certificates (+%d hashes), dbx %d certificates and %d hashes\n",
		b.SecureBoot, len(b.PK.Certificates), len(b.KEK.Certificates), len(b.DB.Certificates), b.DB.Hashes, len(b.DBX.Certificates), b.DBX.Hashes)
	for _, a := range b.Authorities {
		fmt.Fprintf(w, "  authority %s  %s%s\n", a.SHA256, a.Subject, named(a.Name))
	}
	for _, a := range b.BootApplications {
		path := a.Path
		if path == "" {
			path = "(no path)"
		}
		fmt.Fprintf(w, "  PCR 4     %s  %s%s\n", a.SHA256, path, named(a.Pin))
	}
	if b.BootApplicationsOmitted > 0 {
		fmt.Fprintf(w, "  … and %d more boot applications\n", b.BootApplicationsOmitted)
	}
}

func named(name string) string {
	if name == "" {
		return ""
	}
	return " [" + name + "]"
}
