//! The binary encoding of a [`DpEvent`] inside a ledger record (format
//! version 3). It is the ledger's own, independent of the optional `serde`
//! feature; every integer and float is little-endian, floats bit-exact.
//!
//! ```text
//! event = tag u8 | fields
//!   0 no_op
//!   1 gaussian                      noise_multiplier f64
//!   2 laplace                       scale f64
//!   3 randomized_response           epsilon f64 | categories u64
//!   4 poisson_sampled               q f64 | event
//!   5 sampled_without_replacement   source_size u64 | sample_size u64 | event
//!   6 self_composed                 count u64 | event
//!   7 composed                      count u32 | count × event
//!   8 pmixed_query                  beta f64 | members u64
//!   9 pmixed_subsampled             beta f64 | q f64
//!  10 dps_mozo_token                beta f64
//!  11 adapmixed_screening           lambda f64 | members u64 | sigma f64
//!  12 measured                      curve
//!  13 data_dependent                curve
//! curve = n u32 | n × order f64 | n × value f64
//! ```
//!
//! Tags are never reused. Decoding checks every field as construction does
//! (orders sorted and distinct, values non-negative and not NaN, parameters in
//! range via [`DpEvent::validate`]), bounds the nesting at
//! [`MAX_EVENT_DEPTH`] and every count by the bytes left, and requires the
//! encoding to fill its bytes exactly.

use crate::event::{DpEvent, MAX_EVENT_DEPTH};
use crate::{Orders, RdpCurve};

/// Longest event encoding a record may hold, in bytes.
pub const MAX_EVENT_BYTES: usize = 1 << 16;

/// Appends the encoding of `event` to `out`.
pub(crate) fn encode(event: &DpEvent, out: &mut Vec<u8>) {
    let f = |out: &mut Vec<u8>, x: f64| out.extend_from_slice(&x.to_le_bytes());
    let u = |out: &mut Vec<u8>, x: u64| out.extend_from_slice(&x.to_le_bytes());
    match event {
        DpEvent::NoOp => out.push(0),
        DpEvent::Gaussian { noise_multiplier } => {
            out.push(1);
            f(out, *noise_multiplier);
        }
        DpEvent::Laplace { scale } => {
            out.push(2);
            f(out, *scale);
        }
        DpEvent::RandomizedResponse {
            epsilon,
            categories,
        } => {
            out.push(3);
            f(out, *epsilon);
            u(out, *categories);
        }
        DpEvent::PoissonSampled {
            sampling_probability,
            event,
        } => {
            out.push(4);
            f(out, *sampling_probability);
            encode(event, out);
        }
        DpEvent::SampledWithoutReplacement {
            source_size,
            sample_size,
            event,
        } => {
            out.push(5);
            u(out, *source_size);
            u(out, *sample_size);
            encode(event, out);
        }
        DpEvent::SelfComposed { event, count } => {
            out.push(6);
            u(out, *count);
            encode(event, out);
        }
        DpEvent::Composed(events) => {
            out.push(7);
            // Counts past u32 cannot fit MAX_EVENT_BYTES anyway; the caller
            // checks the total length.
            let n = u32::try_from(events.len()).unwrap_or(u32::MAX);
            out.extend_from_slice(&n.to_le_bytes());
            for e in events {
                encode(e, out);
            }
        }
        DpEvent::PmixedQuery { beta, members } => {
            out.push(8);
            f(out, *beta);
            u(out, *members);
        }
        DpEvent::PmixedSubsampled {
            beta,
            sampling_probability,
        } => {
            out.push(9);
            f(out, *beta);
            f(out, *sampling_probability);
        }
        DpEvent::DpsMozoToken { beta } => {
            out.push(10);
            f(out, *beta);
        }
        DpEvent::AdapmixedScreening {
            lambda,
            members,
            sigma,
        } => {
            out.push(11);
            f(out, *lambda);
            u(out, *members);
            f(out, *sigma);
        }
        DpEvent::Measured(curve) | DpEvent::DataDependent(curve) => {
            out.push(if matches!(event, DpEvent::Measured(_)) {
                12
            } else {
                13
            });
            let n = u32::try_from(curve.orders().len()).unwrap_or(u32::MAX);
            out.extend_from_slice(&n.to_le_bytes());
            for &a in curve.orders().as_slice() {
                f(out, a);
            }
            for &e in curve.epsilons() {
                f(out, e);
            }
        }
    }
}

/// The ledger's encoding of `event`: the bytes a record holds, for stores that
/// keep events in their own tables (privmix's PostgreSQL ledger) and must read
/// them back exactly as a ledger file does.
pub fn encode_event(event: &DpEvent) -> Vec<u8> {
    let mut out = Vec::new();
    encode(event, &mut out);
    out
}

/// An event encoding [`decode_event`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid event encoding: {reason}")]
pub struct EventDecodeError {
    /// What is wrong with it.
    pub reason: String,
}

/// Decodes what [`encode_event`] wrote, checking every field as construction
/// does and that the encoding fills `bytes` exactly.
pub fn decode_event(bytes: &[u8]) -> Result<DpEvent, EventDecodeError> {
    decode(bytes).map_err(|reason| EventDecodeError { reason })
}

/// Decodes an event that must fill `bytes` exactly, and validates it.
pub(crate) fn decode(bytes: &[u8]) -> Result<DpEvent, String> {
    let mut cursor = Cursor { bytes, at: 0 };
    let event = cursor.event(0)?;
    if cursor.at != bytes.len() {
        return Err("bytes after the event".into());
    }
    event
        .validate()
        .map_err(|e| format!("stored event is invalid: {e}"))?;
    Ok(event)
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let end = self.at + N;
        let slice = self
            .bytes
            .get(self.at..end)
            .ok_or_else(|| "event encoding ends early".to_string())?;
        self.at = end;
        Ok(slice.try_into().expect("N bytes"))
    }

    fn f64(&mut self) -> Result<f64, String> {
        Ok(f64::from_le_bytes(self.take()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take()?))
    }

    fn u32(&mut self) -> Result<usize, String> {
        Ok(u32::from_le_bytes(self.take()?) as usize)
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn inner(&mut self, depth: usize) -> Result<Box<DpEvent>, String> {
        self.event(depth + 1).map(Box::new)
    }

    fn event(&mut self, depth: usize) -> Result<DpEvent, String> {
        if depth >= MAX_EVENT_DEPTH {
            return Err("event nested deeper than MAX_EVENT_DEPTH".into());
        }
        let [tag] = self.take::<1>()?;
        Ok(match tag {
            0 => DpEvent::NoOp,
            1 => DpEvent::Gaussian {
                noise_multiplier: self.f64()?,
            },
            2 => DpEvent::Laplace { scale: self.f64()? },
            3 => DpEvent::RandomizedResponse {
                epsilon: self.f64()?,
                categories: self.u64()?,
            },
            4 => DpEvent::PoissonSampled {
                sampling_probability: self.f64()?,
                event: self.inner(depth)?,
            },
            5 => DpEvent::SampledWithoutReplacement {
                source_size: self.u64()?,
                sample_size: self.u64()?,
                event: self.inner(depth)?,
            },
            6 => DpEvent::SelfComposed {
                count: self.u64()?,
                event: self.inner(depth)?,
            },
            7 => {
                let n = self.u32()?;
                // Every event takes at least its tag byte.
                if n > self.left() {
                    return Err("composed event count exceeds the bytes left".into());
                }
                let mut events = Vec::with_capacity(n);
                for _ in 0..n {
                    events.push(self.event(depth + 1)?);
                }
                DpEvent::Composed(events)
            }
            8 => DpEvent::PmixedQuery {
                beta: self.f64()?,
                members: self.u64()?,
            },
            9 => DpEvent::PmixedSubsampled {
                beta: self.f64()?,
                sampling_probability: self.f64()?,
            },
            10 => DpEvent::DpsMozoToken { beta: self.f64()? },
            11 => DpEvent::AdapmixedScreening {
                lambda: self.f64()?,
                members: self.u64()?,
                sigma: self.f64()?,
            },
            12 => DpEvent::Measured(self.curve()?),
            13 => DpEvent::DataDependent(self.curve()?),
            other => return Err(format!("unknown event tag {other}")),
        })
    }

    fn curve(&mut self) -> Result<RdpCurve, String> {
        let n = self.u32()?;
        if n == 0 || n > self.left() / 16 {
            return Err("curve order count does not fit the event".into());
        }
        let stored = (0..n).map(|_| self.f64()).collect::<Result<Vec<_>, _>>()?;
        let orders = Orders::new(stored.clone()).map_err(|e| e.to_string())?;
        if orders.as_slice() != stored.as_slice() {
            return Err("curve orders are not sorted and distinct".into());
        }
        let values = (0..n).map(|_| self.f64()).collect::<Result<Vec<_>, _>>()?;
        RdpCurve::new(orders, values).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> DpEvent {
        let curve = RdpCurve::new(
            Orders::new(vec![2.0, 4.5]).unwrap(),
            vec![0.0, f64::INFINITY],
        )
        .unwrap();
        DpEvent::Composed(vec![
            DpEvent::NoOp,
            DpEvent::gaussian(1.5)
                .unwrap()
                .poisson_sampled(0.01)
                .unwrap(),
            DpEvent::laplace(0.5)
                .unwrap()
                .sampled_without_replacement(100, 7)
                .unwrap()
                .self_composed(3)
                .unwrap(),
            DpEvent::randomized_response(1.0, 5).unwrap(),
            DpEvent::PmixedQuery {
                beta: 0.01,
                members: 9,
            },
            DpEvent::PmixedSubsampled {
                beta: 0.02,
                sampling_probability: 0.5,
            },
            DpEvent::DpsMozoToken { beta: 0.1 },
            DpEvent::AdapmixedScreening {
                lambda: 1e-3,
                members: 4,
                sigma: 0.3,
            },
            DpEvent::Measured(curve.clone()),
            DpEvent::DataDependent(curve),
        ])
    }

    #[test]
    fn every_variant_round_trips_bit_exact() {
        let event = sample();
        let mut bytes = Vec::new();
        encode(&event, &mut bytes);
        assert_eq!(decode(&bytes).unwrap(), event);
        // Trailing bytes and every truncation are refused.
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode(&long).unwrap_err().contains("bytes after"));
        // The public pair is the same encoding, its refusal typed.
        assert_eq!(encode_event(&event), bytes);
        assert_eq!(decode_event(&bytes).unwrap(), event);
        assert!(
            decode_event(&long)
                .unwrap_err()
                .reason
                .contains("bytes after")
        );
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
    }

    #[test]
    fn invalid_contents_are_refused_with_reasons() {
        let enc = |e: &DpEvent| {
            let mut b = Vec::new();
            encode(e, &mut b);
            b
        };
        let bad_sigma = enc(&DpEvent::Gaussian {
            noise_multiplier: -1.0,
        });
        assert!(decode(&bad_sigma).unwrap_err().contains("sigma"));
        assert!(decode(&[99]).unwrap_err().contains("unknown event tag 99"));
        // A composed count larger than the bytes could hold.
        assert!(
            decode(&[7, 255, 255, 255, 255])
                .unwrap_err()
                .contains("count")
        );
        // A curve with a NaN value, and one with unsorted orders.
        let mut nan = vec![12, 1, 0, 0, 0];
        nan.extend_from_slice(&2.0f64.to_le_bytes());
        nan.extend_from_slice(&f64::NAN.to_le_bytes());
        assert!(decode(&nan).unwrap_err().contains("invalid"));
        let mut unsorted = vec![12, 2, 0, 0, 0];
        for x in [3.0f64, 2.0, 0.1, 0.1] {
            unsorted.extend_from_slice(&x.to_le_bytes());
        }
        assert!(decode(&unsorted).unwrap_err().contains("sorted"));
        // Nesting past the limit, which the encoder would also write.
        let deep: Vec<u8> = std::iter::repeat_n([6u8, 1, 0, 0, 0, 0, 0, 0, 0], MAX_EVENT_DEPTH)
            .flatten()
            .chain([0])
            .collect();
        assert!(decode(&deep).unwrap_err().contains("deeper"));
        // An inapplicable sampling, though every field is in range.
        let rr = enc(&(DpEvent::PoissonSampled {
            sampling_probability: 0.5,
            event: Box::new(DpEvent::randomized_response(1.0, 2).unwrap()),
        }));
        assert!(decode(&rr).unwrap_err().contains("add/remove"));
    }
}
