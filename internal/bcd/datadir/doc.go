// Package datadir names the files and folders of bcd's data directory
// (default /var/lib/bcd) in one place: the identity and its keys, the
// journal, the local API's run folder and the command line's credentials.
// The packages that read and write them (identity, journal, localserver,
// the commands) take their paths from here. It does no I/O.
package datadir
