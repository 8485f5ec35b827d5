package main

import (
	"github.com/spf13/cobra"

	"github.com/atsinfer/ats/runtime/backend/cuda"
)

func init() {
	register(func() *cobra.Command {
		return &cobra.Command{
			Use:   "gpu",
			Short: "Show whether CUDA is available, the GPUs, and what NVML reports",
			Long: `gpu reports whether ats can use a GPU here (and why not), each CUDA device's
name, compute capability, memory and multiprocessors, the kernel images ats
would load on it (SASS, or PTX the driver JIT-compiles), and NVML's live
figures where NVML is installed. It only queries: no context is created and
no memory is allocated.`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return cuda.Report(cmd.OutOrStdout())
			},
		}
	})
}
