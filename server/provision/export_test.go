package provision

import (
	"encoding/base64"
	"regexp"
	"testing"
)

// AnswerLost is answerLost: whether a RunInstances error leaves the launch
// unknown.
var AnswerLost = answerLost

var userDataFile = regexp.MustCompile(`echo ([A-Za-z0-9+/=]+) \| base64 -d >(\S+)`)

// ReadUserData reads back what a launched host's first user-data part
// writes: its settings file and its host setup file ("" if none).
func ReadUserData(t testing.TB, data string) (settings, hostSetup string) {
	t.Helper()
	for _, m := range userDataFile.FindAllStringSubmatch(data, -1) {
		b, err := base64.StdEncoding.DecodeString(m[1])
		if err != nil {
			t.Fatalf("user data file %s: %v", m[2], err)
		}
		switch m[2] {
		case provisionedEnvPath:
			settings = string(b)
		case hostSetupPath:
			hostSetup = string(b)
		}
	}
	return settings, hostSetup
}
