// optim/optim.h — the training layer in one include: optimizers over FP32 master weights (SGD, Adam, AdamW),
// learning-rate schedules, gradient clipping and the loss scaler (mixtape::amp::GradScaler).
// mixtape.h includes it.
#pragma once

#include <mixtape/optim/adam.h>
#include <mixtape/optim/clip.h>
#include <mixtape/optim/grad_scaler.h>
#include <mixtape/optim/inspect.h>
#include <mixtape/optim/lr_scheduler.h>
#include <mixtape/optim/optimizer.h>
#include <mixtape/optim/sgd.h>
