package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

// splitRemote parses "ID:/path" (a path in a sandbox); ok is false for a
// local path. A local path containing ':' can be written as ./a:b. ":/path"
// is a sandbox path without an id (the client then says an id is
// required).
func splitRemote(s string) (id, path string, ok bool) {
	if strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".") {
		return "", s, false
	}
	id, path, ok = strings.Cut(s, ":")
	if !ok || strings.Contains(id, "/") {
		return "", s, false
	}
	return id, path, true
}

func newCpCmd(g *globals) *cobra.Command {
	var user string
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file into or out of a sandbox (ID:PATH names a sandbox file; - is stdin/stdout)",
		Long: `Copy a file into or out of a sandbox. ID:PATH names a file in sandbox ID: an
absolute PATH, or one relative to the sandbox's working directory (where exec
runs commands: the session's --workdir, else its template's WORKDIR, else the
user's home). ID: alone is that directory; - is stdin or stdout.`,
		Example: `  forkbox cp data.csv abc123:            # into the working directory
  forkbox cp abc123:out.png .             # out of it
  forkbox cp data.csv abc123:/tmp/data.csv
  forkbox cp abc123:/tmp/out.png ./out.png`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			srcID, srcPath, srcRemote := splitRemote(args[0])
			dstID, dstPath, dstRemote := splitRemote(args[1])
			switch {
			case srcRemote == dstRemote:
				return fmt.Errorf("exactly one of SRC and DST must be ID:PATH")
			case dstRemote:
				var e *client.Entry
				if srcPath == "-" {
					e, err = c.Upload(cmd.Context(), dstID, dstPath, cmd.InOrStdin(), -1, user)
				} else {
					switch {
					case dstPath == "" || dstPath == ".":
						dstPath = filepath.Base(srcPath) // ID: is the working directory
					case strings.HasSuffix(dstPath, "/"):
						dstPath += filepath.Base(srcPath)
					}
					e, err = c.UploadFile(cmd.Context(), dstID, dstPath, srcPath, user)
				}
				if err != nil {
					return err
				}
				if g.json {
					return printJSON(cmd.OutOrStdout(), e)
				}
				return nil
			case dstPath == "-":
				rc, err := c.Download(cmd.Context(), srcID, srcPath, user)
				if err != nil {
					return err
				}
				defer rc.Close()
				_, err = io.Copy(cmd.OutOrStdout(), rc)
				return err
			default:
				if fi, err := os.Stat(dstPath); err == nil && fi.IsDir() {
					dstPath = filepath.Join(dstPath, filepath.Base(srcPath))
				}
				return c.DownloadFile(cmd.Context(), srcID, srcPath, dstPath, user)
			}
		},
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "sandbox user that reads or owns the file")
	return cmd
}
