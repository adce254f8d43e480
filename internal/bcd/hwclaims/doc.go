// Package hwclaims reads what a Linux host says about itself: the hardware
// claims a node sends with its join (product UUID and serials, permanent MACs,
// GPU UUIDs, hostname, boot id).
//
// They are claims, not proof: firmware fills them in, and a root user can
// change any of them. Read never fails; a value that cannot be read (the DMI
// serials are readable only by root), or that is a firmware placeholder such
// as "To Be Filled By O.E.M.", is left empty. Values are normalized so the
// same machine reports the same claims on every join, and bounded
// (MaxValueLen, MaxItems) so a hostile host cannot send arbitrarily much.
package hwclaims
