//! `train`'s flags that are bad on their own (no file needed): zero or negative sizes, flags
//! that need another (`--pipeline`, `--micro-batches`, `--shard-optimizer`...), or that contradict
//! each other.

use super::{case, Case};

pub(super) fn train_flag_cases() -> Vec<Case> {
    vec![
        case(&["train", "--batch-size", "0"], &["--batch-size"]),
        case(
            &["train", "--pipeline", "1"],
            &["--pipeline 1", "at least 2"],
        ),
        case(&["train", "--pipeline", "0"], &["--pipeline"]),
        case(
            &["train", "--pipeline", "2", "--accumulate", "2"],
            &["--pipeline", "--accumulate"],
        ),
        case(
            &["train", "--pipeline", "2", "--precision", "fp16"],
            &["--pipeline", "fp16"],
        ),
        case(
            &["train", "--pipeline", "2", "--device", "cpu"],
            &["--pipeline", "GPUs"],
        ),
        case(
            &["train", "--micro-batches", "4"],
            &["--micro-batches", "--pipeline"],
        ),
        case(
            &["train", "--pipeline", "2", "--micro-batches", "0"],
            &["--micro-batches"],
        ),
        case(
            &["train", "--pipeline-split", "5,4"],
            &["--pipeline-split", "--pipeline"],
        ),
        case(
            &["train", "--pipeline", "2", "--pipeline-split", "3,3,3"],
            &["--pipeline-split", "3 stage(s)"],
        ),
        case(
            &["train", "--memory-fraction", "0.5"],
            &["--memory-fraction"],
        ),
        case(
            &["train", "--memory-fraction", "1.5"],
            &["--memory-fraction"],
        ),
        case(
            &["train", "--model", "resnet18", "--pipeline", "2"],
            &["--pipeline", "--model"],
        ),
        case(
            &["train", "--shard-optimizer"],
            &["--shard-optimizer", "--gpus"],
        ),
        case(
            &["train", "--no-shard-optimizer"],
            &["--no-shard-optimizer", "--gpus"],
        ),
        case(&["train", "--comm-sms", "16"], &["--comm-sms", "--gpus"]),
        case(
            &[
                "train",
                "--gpus",
                "2",
                "--shard-optimizer",
                "--no-shard-optimizer",
            ],
            &["--shard-optimizer", "--no-shard-optimizer"],
        ),
        case(
            &[
                "train",
                "--gpus",
                "2",
                "--shard-optimizer",
                "--precision",
                "fp16",
            ],
            &["--shard-optimizer", "bf16"],
        ),
        case(
            &["train", "--model", "resnet18", "--shard-optimizer"],
            &["--shard-optimizer", "--model"],
        ),
        case(&["train", "--batch-size", "-1"], &["--batch-size"]),
        case(&["train", "--lr", "0"], &["--lr"]),
        case(&["train", "--lr", "-1"], &["--lr"]),
        case(&["train", "--lr", "nan"], &["--lr"]),
        case(&["train", "--layers", "16,x,1"], &["--layers"]),
        case(
            &["train", "--layers", "5,64,1"],
            &["--layers", "16 features"],
        ),
        case(&["train", "--epochs", "0"], &["--epochs"]),
        case(&["train", "--steps", "0"], &["--steps"]),
        case(&["train", "--accumulate", "0"], &["--accumulate"]),
        case(&["train", "--optimizer", "rmsprop"], &["--optimizer"]),
        case(&["train", "--loss", "hinge"], &["--loss"]),
        case(&["train", "--eval-fraction", "1"], &["--eval-fraction"]),
        case(
            &["train", "--optimizer", "adam", "--momentum", "0.9"],
            &["--momentum"],
        ),
        case(&["train", "--precision", "fp16"], &["--precision"]),
    ]
}
