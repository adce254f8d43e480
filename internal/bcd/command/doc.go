// Package command is the bcd command line: join and status.
package command
