package sampler

import "testing"

func TestParseTokenID(t *testing.T) {
	for s, want := range map[string]int{"0": 0, "1": 1, "151643": 151643, "2147483647": 2147483647} {
		if got, err := ParseTokenID(s); err != nil || got != want {
			t.Errorf("ParseTokenID(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	// Issue 33: "+1" was taken, and "01" meant the same token as "1".
	for _, s := range []string{"", "+1", "-1", "01", "00", " 1", "1 ", "1e3", "0x10", "١", "2147483648", "99999999999999999999"} {
		if got, err := ParseTokenID(s); err == nil {
			t.Errorf("ParseTokenID(%q) = %d, want an error", s, got)
		}
	}
}
