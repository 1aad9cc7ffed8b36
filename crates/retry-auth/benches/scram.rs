//! AU-9: what the key cache saves. The client side of one SCRAM-SHA-256 conversation up to its
//! client-final message (start + server-first), with a fresh mechanism (keys derived: PBKDF2 at
//! 4096 iterations) and with one whose cache already holds the salt's keys.

#![allow(missing_docs)] // criterion's macros generate undocumented functions.

use std::sync::{Arc, Mutex};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use criterion::{criterion_group, criterion_main, Criterion};
use retry_auth::{Scram, ScramVersion};
use retry_core::auth::{Credential, Mechanism, MechanismStart};
use retry_core::rng::EngineRng;

fn scram(version: ScramVersion) -> Scram {
    let credential = Credential::new("alice", "pencil", "admin");
    let rng = Arc::new(Mutex::new(EngineRng::from_seed_u64(1)));
    Scram::new(version, &credential, rng).expect("a credential")
}

/// start, then the client-final message for a server-first with a fixed salt.
fn client_final(scram: &Scram) -> Vec<u8> {
    let MechanismStart::Sasl {
        payload,
        mut conversation,
    } = scram.start().expect("starts")
    else {
        unreachable!("SCRAM is SASL")
    };
    let first = String::from_utf8(payload).expect("ASCII");
    let nonce = first.rsplit_once("r=").expect("a nonce").1;
    let server_first = format!("r={nonce}srv,s={},i=4096", B64.encode(b"0123456789abcdef"));
    conversation
        .step(server_first.as_bytes())
        .expect("client-final")
}

fn bench(c: &mut Criterion) {
    for version in [ScramVersion::Sha256, ScramVersion::Sha1] {
        let name = version.name();
        c.bench_function(&format!("{name} client-final, keys derived"), |b| {
            b.iter(|| client_final(&scram(version)))
        });
        let cached = scram(version);
        client_final(&cached);
        c.bench_function(&format!("{name} client-final, keys cached"), |b| {
            b.iter(|| client_final(&cached))
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
