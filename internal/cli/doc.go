// Package cli holds what both command-line programs share: exit codes,
// logger setup and the error type that carries an exit code.
package cli
