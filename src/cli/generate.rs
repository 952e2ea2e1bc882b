//! `switchyard generate`: streams a completion of one prompt to stdout, then
//! reports prompt and generation speed on stderr.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use switchyard_engine::chat_choice::{self, TemplateSpec};
use switchyard_engine::kv::{KvBlocks, KvPool};
use switchyard_engine::model::{LlamaModel, LogitRows};
use switchyard_engine::prompt;
use switchyard_engine::sampling::{
    FinishReason, Sampler, SamplingParams, StopChecker, StopCondition,
};
use switchyard_engine::session::Session;
use switchyard_engine::speculate::{self, DraftModel, DraftRun, Ngram};
use switchyard_engine::tokenizer::Tokenizer;
use switchyard_kernels::Backend;
use switchyard_seam::{ChatMessage, Prompt, Role};

use super::device::{load_adapter, load_model, on_device, DeviceArgs, OnDevice};

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// A GGUF file or a Hugging Face folder.
    #[arg(long)]
    model: PathBuf,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Send the prompt as a user message through the model's chat template.
    #[arg(long)]
    chat: bool,
    /// A system message (with --chat).
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// The chat template (with --chat): a known template's name (chatml,
    /// gemma) or a Jinja file [default: the file's own, else its family's].
    #[arg(long, requires = "chat")]
    chat_template: Option<String>,
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// 0 picks the most likely token every time (greedy).
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Makes sampling reproducible.
    #[arg(long)]
    seed: Option<u64>,
    /// Stop when this text is generated (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// A LoRA adapter over the model: a PEFT folder or a llama.cpp GGUF
    /// adapter.
    #[arg(long)]
    lora: Option<PathBuf>,
    #[command(flatten)]
    device: DeviceArgs,
    #[command(flatten)]
    speculate: super::speculate::SpeculateArgs,
    /// A smaller model of the same tokenizer whose greedy tokens the model
    /// verifies (see --speculate; the output is the model's own).
    #[arg(long)]
    draft_model: Option<PathBuf>,
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    on_device(
        args.device.device,
        args.device.count(),
        args.device.attention(),
        Generate(args),
    )
}

struct Generate(GenerateArgs);

impl OnDevice for Generate {
    type Output = ();

    fn run<B: Backend>(self, backend: Arc<B>) -> anyhow::Result<()> {
        generate(backend.as_ref(), self.0)
    }
}

fn generate<B: Backend>(backend: &B, args: GenerateArgs) -> anyhow::Result<()> {
    let checkpoint = load_model(&args.model)?;
    let tokenizer = Tokenizer::load(&checkpoint.tokenizer)
        .with_context(|| format!("cannot load the tokenizer of {}", args.model.display()))?;
    let model = LlamaModel::load(backend, &checkpoint)?;
    let adapter = load_adapter(backend, args.lora.as_deref(), &checkpoint)?;
    let prompt = if args.chat {
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new(Role::System, system.as_str()));
        }
        messages.push(ChatMessage::new(Role::User, args.prompt.as_str()));
        Prompt::Chat(messages)
    } else {
        Prompt::Text(args.prompt.clone())
    };
    let spec = args
        .chat_template
        .as_ref()
        .map(|value| TemplateSpec::new(value, "--chat-template"));
    let (template, _) =
        chat_choice::choose(spec.as_ref(), &tokenizer, Some(model.config().architecture))?;
    let prompt = prompt::encode(&prompt, &tokenizer, &template)?;
    let context = model.config().context_length;
    anyhow::ensure!(
        prompt.len() < context,
        "the prompt is {} tokens; the model's context window is {context}",
        prompt.len()
    );
    let max_tokens = args.max_tokens.min(context - prompt.len());
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        seed: args.seed,
        ..SamplingParams::default()
    };
    params.validate_for_vocab(model.config().vocab_size)?;
    let mut sampler = Sampler::new(params);
    let mut stop = StopChecker::new(StopCondition {
        stop_token_ids: tokenizer.eos_ids().to_vec(),
        stop_strings: args.stop.clone(),
        max_tokens: Some(max_tokens),
        unsure: None,
    });
    let mut decoder = tokenizer.decode_stream(true);
    let kv = KvPool::new(args.device.kv());
    let mut session = Session::with_kv(backend, &model, &kv, prompt.len() + max_tokens)?
        .with_adapter(adapter.as_ref());
    let mut out = std::io::stdout().lock();

    let speculation = args.speculate.speculation()?;
    let mut control = speculation.control();
    let drafter = speculation.looks_up().then(Ngram::default);
    let draft_model = match &args.draft_model {
        Some(path) if speculation.uses_draft_model() => {
            let checkpoint = load_model(path)?;
            let draft_tokenizer = Tokenizer::load(&checkpoint.tokenizer)
                .with_context(|| format!("cannot load the tokenizer of {}", path.display()))?;
            let draft = LlamaModel::load(backend, &checkpoint)?;
            let paired = DraftModel::pair(
                draft,
                path,
                &draft_tokenizer,
                &tokenizer,
                model.config().vocab_size,
            )
            .map_err(|e| anyhow::anyhow!("cannot use {} as a draft model: {e}", path.display()))?;
            Some(paired)
        }
        _ => None,
    };
    anyhow::ensure!(
        draft_model.is_some() || !matches!(speculation, speculate::Speculation::Draft { .. }),
        "--speculate draft needs a --draft-model"
    );
    let mut draft_run = match &draft_model {
        Some(draft) => Some((
            DraftRun::new(
                backend,
                &KvBlocks::new(backend, &kv)?,
                &draft.model,
                prompt.len() + max_tokens,
            )?,
            draft.model.new_scratch(backend),
        )),
        None => None,
    };
    let vocab = model.config().vocab_size.max(1);

    let started = Instant::now();
    // The rows of the last feed: one, or one per verified draft token and one more.
    let mut rows = session.feed(&prompt, LogitRows::Last)?;
    let prefill = started.elapsed();
    let mut history = prompt.clone();
    let decoding = Instant::now();
    let mut generated = 0usize;
    let mut draft: Vec<u32> = Vec::new();
    let (mut drafted, mut accepted) = (0usize, 0usize);
    loop {
        // Each row's token is sampled as plain decoding would; a draft
        // token counts only when it is the token sampled (`speculate::verify`).
        let mut failed: Option<anyhow::Error> = None;
        let mut emit = |row: &[f32]| -> anyhow::Result<Option<u32>> {
            let token = sampler.sample(row, &history)?.id;
            generated += 1;
            history.push(token);
            let text = decoder.step(token)?.unwrap_or_default();
            let step = stop.push(token, &text);
            out.write_all(step.text.as_bytes())?;
            out.flush()?;
            Ok(step.finished.is_none().then_some(token))
        };
        let verdict = speculate::verify(&draft, rows.chunks_exact(vocab), |row| {
            emit(row).unwrap_or_else(|e| {
                failed = Some(e);
                None
            })
        });
        if let Some(error) = failed {
            return Err(error);
        }
        if let (Some(control), false) = (control.as_mut(), draft.is_empty()) {
            control.record(draft.len(), verdict.accepted);
            drafted += draft.len();
            accepted += verdict.accepted;
        }
        if verdict.ended {
            break;
        }
        // The cache holds every kept token; the last one runs next.
        session.truncate(history.len() - 1)?;
        let Some(&last) = history.last() else { break };
        draft.clear();
        let room = max_tokens.saturating_sub(generated + 1);
        let wanted = control.as_mut().map_or(0, |c| c.wanted().min(room));
        let wanted = wanted.min(speculate::MAX_DRAFT);
        if let Some(drafter) = &drafter {
            drafter.draft(&history, wanted, &mut draft);
        }
        if let (Some((run, scratch)), Some(draft_model), true) =
            (draft_run.as_mut(), &draft_model, draft.is_empty())
        {
            run.draft(
                backend,
                &draft_model.model,
                scratch,
                &history,
                wanted,
                &mut draft,
            )?;
        }
        rows = if draft.is_empty() {
            session.decode(&[last], LogitRows::Last)?
        } else {
            let verify: Vec<u32> = std::iter::once(last).chain(draft.iter().copied()).collect();
            session.decode(&verify, LogitRows::All)?
        };
    }
    let tail = decoder.flush()?.unwrap_or_default();
    // Text after a stop string or token is not output.
    if stop.finished() != Some(FinishReason::Stop) {
        out.write_all(tail.as_bytes())?;
    }
    out.write_all(stop.flush().as_bytes())?;
    writeln!(out)?;
    let decode = decoding.elapsed();
    eprintln!(
        "prompt: {} tokens, {:.1} tokens/s; generation: {generated} tokens, {:.1} tokens/s ({} threads, {})",
        prompt.len(),
        prompt.len() as f64 / prefill.as_secs_f64(),
        // The first generated token came from the prompt's logits.
        generated.saturating_sub(1) as f64 / decode.as_secs_f64(),
        args.device.count(),
        backend.name(),
    );
    if drafted > 0 {
        eprintln!(
            "speculation: {accepted} of {drafted} drafted tokens accepted ({:.0}%)",
            100.0 * accepted as f64 / drafted as f64
        );
    }
    Ok(())
}
