// Package bcdcli is the bcd command line: join and status.
package bcdcli
