// Package fileperm checks that a folder holding secrets (bcd's data and
// credentials folders, fleetd's PKI and data folders) cannot be changed by
// other users of the machine, and whether a secret file (a join token) can
// be read by them. Each problem comes with the chmod or chown that repairs
// it. Both binaries import it; it never changes a mode or an owner itself.
package fileperm
