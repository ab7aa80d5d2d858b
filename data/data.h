// data/data.h — the data layer in one include: IDX files, MNIST and its loader, safetensors files, checkpoints.
//
// Files become CPU tensors here and nothing else: the layer sees core/ alone (a batch is a tensor).
#pragma once

#include <mixtape/data/checkpoint.h>
#include <mixtape/data/dataloader.h>
#include <mixtape/data/idx.h>
#include <mixtape/data/mnist.h>
#include <mixtape/data/safetensors.h>
