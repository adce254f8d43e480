// Package doctor holds the checks of bcd doctor as pure functions: each takes
// what the command gathered (a load error, a certificate, a clock offset, the
// outcome of a dial) and returns one Result, so every outcome can be tested
// without a machine in that state. The command gathers the inputs, prints the
// results with Print and exits with ExitCode(Worst(results)).
//
// Every Result that is not a pass carries a Fix: the way back, as a command
// or a step an operator can take. Fix texts name the real commands, such as
// "bcd join --reset --yes --attestor tpm" for a node that joined with its
// TPM, or the chmod that closes a folder others may write.
package doctor
