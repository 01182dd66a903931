/* SPDX-License-Identifier: Apache-2.0 */
/* folder.h - a Hugging Face / diffusers model folder as the checkpoints in it,
 * for the commands that take a folder where they take a checkpoint. */
#ifndef FERRY_CLI_FOLDER_H
#define FERRY_CLI_FOLDER_H

#include <stdbool.h>
#include <stddef.h>

#include "cli.h"

typedef struct cli_component {
    char *name; /* the subfolder model_index.json names ("transformer"), or "." for the folder itself */
    char *path; /* the checkpoint picked (folder/name/file), or NULL: the component has no weights */
    char *note; /* how it was picked or why there is none ("the fp16 variant: no plain file"), or NULL */
} cli_component;

typedef struct cli_folder {
    cli_component *c; /* sorted by name */
    int n;
} cli_folder;

/* Whether path names a directory (following symlinks). */
bool cli_is_dir(const char *path);

/* The checkpoints of the folder dir:
 *  - with a model_index.json (diffusers): one component per name in it whose
 *    value is a [library, class] pair, each its subfolder's checkpoint
 *    (scheduler/, tokenizer/ and the like have none);
 *  - without one: the folder's own single checkpoint, component ".".
 * A folder's checkpoint, as ferry.diffusers.weights_file picks it: the first of
 * STEM.EXT.index.json or STEM.EXT for diffusion_pytorch_model.safetensors,
 * model.safetensors, diffusion_pytorch_model.bin, model.bin, transformers'
 * pytorch_model.bin; failing those, a variant
 * (STEM.VARIANT.safetensors, STEM.safetensors.index.VARIANT.json; the first
 * variant by name); failing those, the folder's one *.safetensors.index.json,
 * else its one checkpoint file (.safetensors, .gguf, .bin, .pt, .pth, .ckpt).
 * Returns 0, or an exit status after printing the reason: EXIT_USAGE (as cmd's
 * usage error) for a folder with nothing ferry can read (the message names it), EXIT_FAIL for a
 * model_index.json that is not a JSON object, or a folder that cannot be read. */
int cli_folder_open(const cli_cmd *cmd, const char *dir, cli_folder *out);
void cli_folder_free(cli_folder *f);

#endif
