// Package command is bcd's command line (cobra): it parses flags, reads
// config.toml and prints. The long-running commands (bcd node, bcd helper)
// hand over to bcd's wiring function (package internal/bcd); the short ones
// (join, status, doctor, run, call, launch) call the packages they need.
// Only cmd/bcd imports it.
package command
