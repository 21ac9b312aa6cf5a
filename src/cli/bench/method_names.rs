//! `--methods`: the names a sweep's methods go by, and the settings a prism
//! name fixes in place of the shared method flags.

use crate::cli::method_args::{MemoryArg, MethodArgs, MethodName, OnOff};
use anyhow::Result;
use clap::parser::ValueSource;
use clap::{ArgMatches, ValueEnum};
use prism::bench::sweep::SweepMethod;
use prism::methods::prism::{MemoryMode, Variant};

/// The sweep's methods as `names` (`--methods`) list them, each with `base`
/// (the method flags) and what its name fixes. An unknown name, or a flag a
/// prism name fixes given as well, is an error.
pub(super) fn sweep_methods(
    names: &[String],
    base: &MethodArgs,
    matches: &ArgMatches,
) -> Result<Vec<SweepMethod>> {
    let methods = names
        .iter()
        .map(|name| BenchMethod::parse(name.trim()))
        .collect::<Result<Vec<_>, String>>()
        .map_err(anyhow::Error::msg)?;
    if methods.iter().any(|method| method.prism.is_some()) {
        for (id, flag) in SET_BY_PRISM_NAMES {
            anyhow::ensure!(
                matches.value_source(id) != Some(ValueSource::CommandLine),
                "{flag} is set by each prism method's name in bench (e.g. prism-in-place-no-updates-unconstrained); leave it out"
            );
        }
    }
    methods
        .iter()
        .map(|method| {
            Ok(SweepMethod {
                name: method.name.clone(),
                spec: method.args(base).spec(method.method)?,
            })
        })
        .collect()
}

/// A method as `--methods` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BenchMethod {
    name: String,
    method: MethodName,
    /// Set for prism, whose variants are told apart by name.
    prism: Option<Variant>,
}

impl BenchMethod {
    /// Parse one `--methods` name; an unknown one is an error listing every valid name.
    fn parse(name: &str) -> Result<Self, String> {
        if let Some(prism) = Variant::parse(name) {
            return Ok(BenchMethod {
                name: name.to_string(),
                method: MethodName::Prism,
                prism: Some(prism),
            });
        }
        match MethodName::from_str(name, true) {
            Ok(method) if method != MethodName::Prism => Ok(BenchMethod {
                name: name.to_ascii_lowercase(),
                method,
                prism: None,
            }),
            _ => Err(format!(
                "unknown method `{name}`; valid names: {}",
                valid_names().join(", ")
            )),
        }
    }

    /// `base` with the settings this name fixes.
    fn args(&self, base: &MethodArgs) -> MethodArgs {
        let mut args = base.clone();
        if let Some(prism) = self.prism {
            args.memory = match prism.memory {
                MemoryMode::Amendments => MemoryArg::Amendments,
                MemoryMode::InPlace => MemoryArg::InPlace,
            };
            args.no_updates = !prism.updates;
            args.constrained = if prism.constrained {
                OnOff::On
            } else {
                OnOff::Off
            };
        }
        args
    }
}

/// Every name `--methods` accepts.
fn valid_names() -> Vec<String> {
    let mut names: Vec<String> = Variant::all().map(|variant| variant.name()).collect();
    names.extend(
        MethodName::value_variants()
            .iter()
            .filter(|method| **method != MethodName::Prism)
            .filter_map(|method| Some(method.to_possible_value()?.get_name().to_string())),
    );
    names
}

/// The flags a prism name decides; giving them too would be silently overridden.
const SET_BY_PRISM_NAMES: [(&str, &str); 3] = [
    ("memory", "--memory"),
    ("no_updates", "--no-updates"),
    ("constrained", "--constrained"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prism_names_fix_memory_updates_and_constraint() {
        let method = BenchMethod::parse("prism-in-place-no-updates-unconstrained").unwrap();
        assert_eq!(method.method, MethodName::Prism);
        assert_eq!(
            method.prism,
            Some(Variant {
                memory: MemoryMode::InPlace,
                updates: false,
                constrained: false
            })
        );
        let amendments = BenchMethod::parse("prism-amendments")
            .unwrap()
            .prism
            .unwrap();
        assert_eq!(amendments.memory, MemoryMode::Amendments);
        assert!(amendments.updates && amendments.constrained);
        let unconstrained = BenchMethod::parse("prism-amendments-unconstrained")
            .unwrap()
            .prism
            .unwrap();
        assert!(unconstrained.updates && !unconstrained.constrained);
    }

    #[test]
    fn every_valid_name_parses_to_itself() {
        for name in valid_names() {
            let method = BenchMethod::parse(&name).unwrap();
            assert_eq!(method.name, name);
        }
    }

    #[test]
    fn other_methods_parse_through_their_value_enum() {
        for method in MethodName::value_variants() {
            if *method == MethodName::Prism {
                continue;
            }
            let name = method.to_possible_value().unwrap().get_name().to_string();
            let parsed = BenchMethod::parse(&name.to_uppercase()).unwrap();
            assert_eq!(
                (parsed.method, parsed.name, parsed.prism),
                (*method, name, None)
            );
        }
    }

    #[test]
    fn unknown_names_list_the_valid_ones() {
        for bad in [
            "prism",
            "prism-amendments-unconstrained-no-updates",
            "prism-inplace",
            "prism-amendments-",
            "nonsense",
        ] {
            let err = BenchMethod::parse(bad).unwrap_err();
            assert!(err.starts_with(&format!("unknown method `{bad}`; valid names: ")));
            assert!(err.contains("prism-amendments, prism-amendments-no-updates"));
            assert!(err.contains("prism-in-place-no-updates-unconstrained"));
        }
    }

    #[test]
    fn names_override_the_shared_prism_flags() {
        use clap::Parser;
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            method_args: MethodArgs,
        }
        let base = Flags::parse_from(["x"]).method_args;
        let args = BenchMethod::parse("prism-in-place-no-updates-unconstrained")
            .unwrap()
            .args(&base);
        assert_eq!(args.memory, MemoryArg::InPlace);
        assert!(args.no_updates);
        assert_eq!(args.constrained, OnOff::Off);
        assert_eq!(args.query, base.query);
    }
}
