package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// byteUnits are the suffixes --keep-runs-size takes: SI (kB, MB, GB, TB:
// powers of 1000) and binary (KiB, MiB, GiB, TiB: powers of 1024). A bare
// number is bytes.
var byteUnits = []struct {
	suffix string
	scale  int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"b", 1},
}

// parseByteSize reads a size such as 2GiB, 500MB, 1048576 or 0: a
// non-negative whole number with an optional unit, in any case.
func parseByteSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	scale := int64(1)
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(t, u.suffix); ok {
			t, scale = strings.TrimSpace(rest), u.scale
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size: a whole number of bytes, optionally with a unit (kB, MB, GB, TB, KiB, MiB, GiB, TiB)", s)
	}
	if n > math.MaxInt64/scale {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n * scale, nil
}

// formatByteSize writes n in the largest binary unit that divides it.
func formatByteSize(n int64) string {
	for _, u := range []struct {
		name  string
		scale int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.scale == 0 {
			return strconv.FormatInt(n/u.scale, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// byteSizeValue is a pflag.Value for a size in bytes.
type byteSizeValue struct{ n *int64 }

func (v byteSizeValue) String() string {
	if v.n == nil {
		return "0"
	}
	return formatByteSize(*v.n)
}

func (v byteSizeValue) Set(s string) error {
	n, err := parseByteSize(s)
	if err != nil {
		return err
	}
	*v.n = n
	return nil
}

func (v byteSizeValue) Type() string { return "size" }
