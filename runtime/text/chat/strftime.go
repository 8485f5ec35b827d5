package chat

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/atsinfer/ats/internal/jinja"
)

// now is the clock strftime_now reads; tests replace it.
var now = time.Now

// maxStrftimeGrowth bounds how much longer strftime's result is than its
// format: %F gives 10 bytes for 2, and no directive gives more per byte.
const maxStrftimeGrowth = 5

// strftimeNow is HF's strftime_now(format): datetime.now().strftime(format),
// local time. Llama 3.1 uses it to date its system prompt. The result
// counts against the rendering's limits before it is built, at its
// longest, so a format of millions of directives is a limit error rather
// than a prompt of tens of megabytes.
func strftimeNow(b *jinja.Budget, args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 || !args[0].IsString() {
		return jinja.Undefined(), fmt.Errorf("strftime_now: want one format string")
	}
	format := args[0].AsString()
	if err := b.Alloc(int64(len(format))*maxStrftimeGrowth, "strftime_now's result"); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(strftime(format, now())), nil
}

// strftime implements the C/Python strftime directives that templates use,
// with glibc's '-' flag for no padding (%-d). It works directive by
// directive rather than through a Go layout, so literal text such as
// "2006" or "Jan" in the format stays literal. Unknown directives are
// copied as is, as glibc does.
func strftime(format string, t time.Time) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		if format[i] != '%' || i+1 >= len(format) {
			b.WriteByte(format[i])
			continue
		}
		start := i
		i++
		pad := true
		if format[i] == '-' && i+1 < len(format) {
			pad = false
			i++
		}
		num := func(n, width int) {
			s := strconv.Itoa(n)
			if pad {
				s = strings.Repeat("0", max(width-len(s), 0)) + s
			}
			b.WriteString(s)
		}
		hour12 := t.Hour() % 12
		if hour12 == 0 {
			hour12 = 12
		}
		switch format[i] {
		case 'Y':
			b.WriteString(strconv.Itoa(t.Year()))
		case 'y':
			num(t.Year()%100, 2)
		case 'm':
			num(int(t.Month()), 2)
		case 'd':
			num(t.Day(), 2)
		case 'e':
			s := strconv.Itoa(t.Day())
			if pad && len(s) < 2 {
				s = " " + s
			}
			b.WriteString(s)
		case 'j':
			num(t.YearDay(), 3)
		case 'H':
			num(t.Hour(), 2)
		case 'I':
			num(hour12, 2)
		case 'M':
			num(t.Minute(), 2)
		case 'S':
			num(t.Second(), 2)
		case 'f':
			num(t.Nanosecond()/1000, 6)
		case 'p':
			b.WriteString(t.Format("PM"))
		case 'b', 'h':
			b.WriteString(t.Format("Jan"))
		case 'B':
			b.WriteString(t.Format("January"))
		case 'a':
			b.WriteString(t.Format("Mon"))
		case 'A':
			b.WriteString(t.Format("Monday"))
		case 'w':
			b.WriteString(strconv.Itoa(int(t.Weekday())))
		case 'z':
			b.WriteString(t.Format("-0700"))
		case 'Z':
			b.WriteString(t.Format("MST"))
		case 'F':
			b.WriteString(t.Format("2006-01-02"))
		case 'T':
			b.WriteString(t.Format("15:04:05"))
		case '%':
			b.WriteByte('%')
		default:
			b.WriteString(format[start : i+1])
		}
	}
	return b.String()
}
