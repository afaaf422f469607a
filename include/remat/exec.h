// The exec layer in one include: checkpoint plans (remat/plan.h), the schedules they
// compile to (remat/schedule.h), parameter storage (remat/params.h) and the executor
// (remat/executor.h), each implemented by the .cpp of its name in src/exec/.
#pragma once

#include "remat/executor.h"
#include "remat/params.h"
#include "remat/plan.h"
#include "remat/schedule.h"
