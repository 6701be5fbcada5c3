// Package lakeshore is the module root. It holds the AWS SAM template, the
// single source of the control plane's DynamoDB schema.
package lakeshore

import _ "embed"

// Template is template.yaml, the AWS SAM template of the control plane,
// embedded at build time. server/store parses it to create the DynamoDB
// tables (in tests, on the embedded store, on moto and for `lakeshore dev`),
// so the deployed schema and the tested one cannot drift apart.
//
//go:embed template.yaml
var Template []byte
