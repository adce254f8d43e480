// Package atomicfile replaces files so that a crash at any moment leaves
// either the old content or the new content under the file's name, never a
// mixture, an empty file or no file.
//
// A replacement is written to a temporary file in the same directory, synced
// to disk, given its mode and renamed over the target; the directory is then
// synced so the rename itself survives a power loss. A crash before the rename
// can leave a temporary file named ".<name>.tmp-*" beside the target; it is
// never read and may be removed.
package atomicfile
