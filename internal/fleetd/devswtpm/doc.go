// Package devswtpm starts a software TPM (swtpm) for fleetd dev --swtpm: a
// TPM on loopback whose EK certificates come from a throwaway local CA of
// its own (swtpm_localca), so that a newcomer sees a TPM join in one
// command. It is fleetd dev's alone; tests start swtpm with tpm/tpmtest.
package devswtpm
