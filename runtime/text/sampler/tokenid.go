package sampler

import (
	"errors"
	"fmt"
)

// ParseTokenID reads a token id written the one way ids are written: in
// decimal digits, without a sign, spaces or leading zeros ("0" is zero).
// strconv.Atoi also takes "+1" and "01", which would let two keys of one
// logit_bias object name the same token, one silently overriding the
// other.
func ParseTokenID(s string) (int, error) {
	if s == "" {
		return 0, errors.New("empty token id")
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, fmt.Errorf("token id %q has a leading zero; write it as %q", s, trimZeros(s))
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%q is not a token id (decimal digits only, no sign)", s)
		}
		if n > (1<<31-1-int(c-'0'))/10 {
			return 0, fmt.Errorf("token id %s is too large", s)
		}
		n = n*10 + int(c-'0')
	}
	return n, nil
}

func trimZeros(s string) string {
	for len(s) > 1 && s[0] == '0' {
		s = s[1:]
	}
	return s
}
