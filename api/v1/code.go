package v1

// The code-execution service of a session (/v1/sessions/{id}/code/...):
// E2B's code-interpreter protocol (section 7 of the E2B compatibility
// notes), the same bodies and lines.

// CodeRequest is the body of POST /v1/sessions/{id}/code/execute.
type CodeRequest struct {
	// Code is the cell's source (required).
	Code string `json:"code"`
	// ContextID runs the cell in that context; "" the default context of
	// Language. Not together with Language.
	ContextID string `json:"context_id,omitempty"`
	// Language is "python" (the default), "javascript" or "bash".
	Language string `json:"language,omitempty"`
	// EnvVars are set for this cell only.
	EnvVars map[string]string `json:"env_vars,omitempty"`
}

// CodeLine is one line of an execute stream. Type is "stdout" or
// "stderr" (Text, Timestamp), "result" (IsMainResult and the MIME
// members, in Data keyed by E2B's names: text, html, png, chart ...),
// "error" (Name, Value, Traceback), "number_of_executions"
// (ExecutionCount), "keepalive" or "end_of_execution" (the last line).
type CodeLine struct {
	Type           string `json:"type"`
	Text           string `json:"text,omitempty"`
	Timestamp      string `json:"timestamp,omitempty"`
	IsMainResult   bool   `json:"is_main_result,omitempty"`
	Name           string `json:"name,omitempty"`
	Value          string `json:"value,omitempty"`
	Traceback      string `json:"traceback,omitempty"`
	ExecutionCount int    `json:"execution_count,omitempty"`
	// Data is the whole line as sent (a result's formats are members of
	// it); set by the client, not on the wire.
	Data map[string]any `json:"-"`
}

// CodeContext is a context of the code-execution service (POST and GET
// /v1/sessions/{id}/code/contexts).
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// CodeContextRequest is the body of POST /v1/sessions/{id}/code/contexts.
type CodeContextRequest struct {
	// Language is "python" (the default), "javascript" or "bash".
	Language string `json:"language,omitempty"`
	// Cwd is the context's working directory ("" the session's; relative:
	// from the default user's home). It must exist.
	Cwd string `json:"cwd,omitempty"`
}
