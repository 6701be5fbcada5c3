// Package hostkey computes the key that names a host's setup (docs/design.md §7):
// "hk1_" and the hex SHA-256 of a canonical encoding of the ordered setup
// commands. A daemon hashes its own --host-setup; the control plane hashes a
// run config's host_setup at submit; equal keys mean the same setup.
package hostkey

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// Prefix is the version tag of the key function. A new encoding gets a new
// prefix so keys of the two never compare equal.
const Prefix = "hk1_"

// Of reports the host key of the ordered setup commands, or "" for none.
//
// The encoding is length-prefixed (a big-endian uint32 count, then each
// command as a uint32 length and its bytes), so no two different lists share
// an encoding: ["a b"] and ["a", "b"] hash differently.
func Of(setup []string) string {
	if len(setup) == 0 {
		return ""
	}
	h := sha256.New()
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(setup)))
	h.Write(n[:])
	for _, cmd := range setup {
		binary.BigEndian.PutUint32(n[:], uint32(len(cmd)))
		h.Write(n[:])
		h.Write([]byte(cmd))
	}
	return Prefix + hex.EncodeToString(h.Sum(nil))
}
