package command

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/internal/fleetd/config"
)

func policyCommand() *cobra.Command {
	c := &cobra.Command{Use: "policy", Short: "Test boot policies (docs/boot-policy.md)"}
	c.AddCommand(policyCheckCommand())
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
			if dir == "" {
				cfg, err := config.LoadFleetd(configPath)
				if err != nil {
					return fmt.Errorf("find the policy directory (or give --dir): %w", err)
				}
				if cfg.BootPolicy.Dir == "" {
					return cli.Usagef("%s names no boot_policy.dir: give --dir", configPath)
				}
				dir = cfg.Resolve(cfg.BootPolicy.Dir)
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
