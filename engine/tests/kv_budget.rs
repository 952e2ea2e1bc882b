//! Issue 17, case 3: the executor admits sequences by the KV bytes they may come to
//! hold, so a request that could never fit is refused at submit and the others wait
//! their turn, instead of every one allocating its whole context (infallibly).

use std::sync::{mpsc, Arc};
use std::time::Duration;

use switchyard_engine::chat::ChatTemplate;
use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::model::LlamaModel;
use switchyard_engine::sampling::{SamplingParams, StopCondition};
use switchyard_engine::serving::{
    CheckpointHandle, CheckpointId, Executor, ExecutorConfig, NoObserver, SequenceEvent,
    SequenceRequest, ServedCheckpoint, SubmitError,
};
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_engine::tokenizer::Tokenizer;
use switchyard_kernels::cpu::CpuBackend;
use switchyard_kernels::DType;

struct Fixture {
    backend: Arc<CpuBackend>,
    checkpoint: CheckpointHandle<CpuBackend>,
    tokenizer: Tokenizer,
    _dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("smollm2-q8.gguf");
    let spec = SyntheticSpec {
        preset: Preset::Smollm2,
        dtype: DType::Q8_0,
        seed: 11,
    };
    write_gguf(&spec, &path).unwrap();
    let checkpoint = load_checkpoint(&path).unwrap();
    let backend = Arc::new(CpuBackend::new(2));
    let model = LlamaModel::load(backend.as_ref(), &checkpoint).unwrap();
    let tokenizer = Tokenizer::load(&checkpoint.tokenizer).unwrap();
    let served = Arc::new(ServedCheckpoint::from_parts(
        CheckpointId::new("test", "1"),
        model,
        tokenizer.clone(),
        ChatTemplate::new_or_default(None).unwrap(),
        &path,
        checkpoint.format,
    ));
    Fixture {
        backend,
        checkpoint: served,
        tokenizer,
        _dir: dir,
    }
}

fn request(
    prompt: Vec<u32>,
    max_tokens: Option<usize>,
) -> (SequenceRequest, mpsc::Receiver<SequenceEvent>) {
    let (sender, receiver) = mpsc::channel();
    let request = SequenceRequest {
        prompt,
        sampling: SamplingParams::default(),
        stop: StopCondition {
            max_tokens,
            ..StopCondition::default()
        },
        decoder: None,
        sink: Box::new(sender),
        deadline: None,
    };
    (request, receiver)
}

/// Tokens generated until `Done`; panics on an error event.
fn completion_tokens(receiver: &mpsc::Receiver<SequenceEvent>) -> usize {
    loop {
        match receiver.recv_timeout(Duration::from_secs(120)).unwrap() {
            SequenceEvent::Token(_) => {}
            SequenceEvent::Done {
                completion_tokens, ..
            } => return completion_tokens,
            SequenceEvent::Error(message) => panic!("sequence failed: {message}"),
        }
    }
}

#[test]
fn requests_wait_for_kv_room_and_one_that_never_fits_is_refused() {
    let f = fixture();
    let config = f.checkpoint.model.config();
    let per_position = config.n_layers * config.n_kv_heads * config.head_dim * 8;
    let prompt = f.tokenizer.encode("Hello there", true).unwrap();
    let need = |max_tokens: usize| per_position * (prompt.len() + max_tokens);
    // Room for one 24-token sequence and a half: two such requests take turns.
    let budget = need(24) * 3 / 2;
    let executor = Executor::spawn(
        f.backend.clone(),
        ExecutorConfig {
            max_active: 8,
            max_queued: 8,
            max_step_tokens: 64,
            kv_budget_bytes: Some(budget),
        },
        Arc::new(NoObserver),
    )
    .unwrap();

    // Without max_tokens a sequence may fill the whole context: it never fits.
    let (whole_context, _rx) = request(prompt.clone(), None);
    let refused = executor.submit(&f.checkpoint, whole_context).unwrap_err();
    match refused {
        SubmitError::KvBudget { needed, budget: b } => {
            assert_eq!(needed, per_position * config.context_length);
            assert_eq!(b, budget);
        }
        other => panic!("expected KvBudget, got {other:?}"),
    }
    assert!(refused.to_string().contains("lower max_tokens"));

    // Two that fit one at a time both finish, the second after the first.
    let (first, first_rx) = request(prompt.clone(), Some(24));
    let (second, second_rx) = request(prompt.clone(), Some(24));
    executor.submit(&f.checkpoint, first).unwrap();
    executor.submit(&f.checkpoint, second).unwrap();
    assert_eq!(completion_tokens(&first_rx), 24);
    assert_eq!(completion_tokens(&second_rx), 24);
    executor.shutdown();
}
